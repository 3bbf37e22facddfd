"""`npusnap prune DIR --keep N`: keep the newest N valid checkpoints in DIR.

Only what `npusnap list` shows as a checkpoint is ever deleted, and only DIR's
direct children (never DIR itself):
  - valid checkpoints beyond the newest N;
  - incomplete (`.NAME.partial-*`) and leftover (`.NAME.old-*`) directories
    unchanged for STALE_AFTER seconds (younger ones may still be being written);
  - `.NAME.deleting-*` directories (an earlier prune was interrupted).
Invalid checkpoints are kept and reported: one may be from a newer npusnap, or
worth a look before it goes. A chain is never broken: a checkpoint that a kept
incremental one references (its parent, theirs, ...) is kept too (image/chain.py).
Then the chunk store (DIR/.npusnap-store, --dedup) loses the chunks no checkpoint
left in DIR references (a pack of chunks less than half unreferenced is kept whole
until more of it is).

A deletion renames the directory to `.NAME.deleting-*` first (atomic: it stops
being a checkpoint at once) and then removes it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import click

from ..image.format import HIDDEN_SIBLING as HIDDEN
from ..image.format import hidden_sibling
from ..numbers import Count
from ..output import Terminal, human_bytes, shown
from . import json_option
from .list import Entry, scan

STALE_AFTER = 3600.0


def plan(directory: Path, keep: int, verify: bool) -> tuple[list[tuple[Entry, str]], list[tuple[Entry, str]]]:
    """(to delete, to keep), each with the reason."""
    root = str(directory)
    delete: list[tuple[Entry, str]] = []
    kept: list[tuple[Entry, str]] = []
    valid = 0
    for e in scan(directory, verify):            # newest first
        if e.path == root:
            kept.append((e, "DIR itself is never pruned"))
        elif e.state == "valid":
            valid += 1
            if valid <= keep:
                kept.append((e, f"among the newest {keep} valid"))
            else:
                delete.append((e, f"older than the newest {keep} valid"))
        elif e.state == "invalid":
            kept.append((e, f"invalid, left for a person to look at: {e.problem}"))
        elif _hidden_kind(Path(e.path)) == "deleting":
            delete.append((e, "an unfinished removal"))
        elif e.age_seconds >= STALE_AFTER:
            delete.append((e, f"{e.state} and unchanged for {e.age_seconds / 3600:.1f} h"))
        else:
            kept.append((e, f"{e.state} but changed {e.age_seconds:.0f} s ago (may still be written)"))
    from ..image.chain import referenced

    need = referenced(Path(e.path) for e, _ in kept if e.state in ("valid", "invalid"))
    for item in list(delete):
        if item[0].state == "valid" and os.path.abspath(item[0].path) in need:
            delete.remove(item)
            kept.append((item[0], "in the parent chain of a kept incremental checkpoint"))
    return delete, kept


def remove(path: Path) -> None:
    """Rename to a hidden `.NAME.deleting-*` sibling (no longer a checkpoint), then remove it."""
    if os.path.islink(path) or not os.path.isdir(path):
        raise OSError(f"{path} is no longer a directory")
    m = HIDDEN.match(path.name)
    if m and m["kind"] == "deleting":
        doomed = path
    else:
        doomed = hidden_sibling(path.parent / (m["name"] if m else path.name), "deleting")
        os.rename(path, doomed)
    shutil.rmtree(doomed)


def _hidden_kind(path: Path) -> str:
    m = HIDDEN.match(path.name)
    return m["kind"] if m else ""


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--keep", type=Count(min=0), required=True, metavar="N",
              help="How many valid checkpoints to keep (the newest by creation time).")
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@click.option("--verify", is_flag=True, help="Recompute checksums to decide what is valid (slow).")
@json_option
@click.pass_obj
def prune(term: Terminal, directory: Path, keep: int, dry_run: bool, verify: bool) -> None:
    """Delete all but the newest N valid checkpoints in DIRECTORY, and incomplete
    ones (`.NAME.partial-*`) untouched for an hour.

    Nothing that is not a checkpoint is touched, nor DIRECTORY itself; invalid
    checkpoints are kept and reported. Each deletion is a rename to a hidden name
    first, so a checkpoint never looks half deleted.
    """
    from ..errors import StorageProblem

    delete, kept = plan(directory, keep, verify)
    deleted: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for e, reason in delete:
        doc = {**_brief(e), "reason": reason}
        if dry_run:
            deleted.append(doc)
            continue
        try:
            remove(Path(e.path))
        except OSError as err:
            failed.append({**doc, "error": err.strerror or str(err)})
            term.warn(f"could not delete {e.path}: {err.strerror or err}")
            continue
        deleted.append(doc)
    freed = sum(d["disk_bytes"] for d in deleted)
    # Then the chunk store's chunks no checkpoint left here references (after the deletions, and
    # under the store's lock: a checkpoint being written holds it until its manifest is in place).
    from ..image.store import collect

    chunks, chunk_bytes = collect(directory, dry_run, {Path(e.path).name for e, _ in delete} if dry_run else ())
    freed += chunk_bytes
    if term.json_mode:
        term.data("prune", {"directory": str(directory.absolute()), "keep": keep, "dry_run": dry_run,
                            "deleted": deleted, "kept": [{**_brief(e), "reason": r} for e, r in kept],
                            "failed": failed, "freed_bytes": 0 if dry_run else freed,
                            "chunks_deleted": chunks, "chunk_bytes": chunk_bytes})
    else:
        verb = "would delete" if dry_run else "deleted"
        for d in deleted:
            click.echo(shown(f"{verb}  {d['path']}  ({d['reason']})"))
        for e, r in kept:
            if e.state != "valid":
                term.warn(f"kept {e.path}: {r}")
        summary = f"{verb} {len(deleted)} of {len(delete) + len(kept)} ({human_bytes(freed)})"
        if chunks:
            summary += f"; {chunks} unreferenced chunks ({human_bytes(chunk_bytes)})"
        term.info(summary if deleted or failed or chunks else f"nothing to prune in {directory}")
    if failed:
        raise StorageProblem(f"could not delete {len(failed)} of {len(delete)} directories in {directory}",
                             "check their permissions and rerun prune")


def _brief(e: Entry) -> dict[str, Any]:
    return {"name": e.name, "path": e.path, "state": e.state, "created": e.created,
            "disk_bytes": e.disk_bytes}
