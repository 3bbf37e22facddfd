"""`npusnap list DIR`: the checkpoints under DIR, and the scan `prune` shares.

A checkpoint is a directory holding manifest.yaml: DIR itself or a direct child
of it. Hidden siblings that npusnap itself names are shown too: `.NAME.partial-*`
(a checkpoint being written, or one whose writer died: incomplete),
`.NAME.old-*` (a checkpoint replaced by --replace) and `.NAME.deleting-*` (one
prune was removing). Anything else, symlinks included, is not a checkpoint and
is neither listed nor ever touched.
"""

from __future__ import annotations

import os
import shlex
import stat
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import click

# The hidden names Staging (image/staging.py) and prune give directories; the token is secrets.token_hex(4).
from ..image.format import HIDDEN_SIBLING as HIDDEN
from ..output import Terminal, human_bytes, shown
from . import json_option


@dataclass
class Entry:
    name: str                     # the checkpoint's name (for hidden ones, the name it was for)
    path: str
    state: str                    # valid | invalid | incomplete | leftover
    created: Optional[str]        # from the manifest (ISO 8601), else None
    timestamp: float              # created as a POSIX time (manifest mtime when created is unreadable)
    age_seconds: float            # since the newest change anywhere inside
    pid: Optional[int] = None
    command: Optional[str] = None
    bytes: int = 0                # image bytes the manifest lists
    disk_bytes: int = 0           # everything in the directory
    files: int = 0
    device: Optional[str] = None  # backend: none | sim | ascend | cuda
    problem: Optional[str] = None # why it is invalid
    members: list[dict[str, Any]] = field(default_factory=list)  # a process set's: pid, files, bytes each
    parent: Optional[str] = None  # an incremental checkpoint's parent directory (image/chain.py)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def scan(directory: Path, verify: bool = False) -> list[Entry]:
    """Checkpoints in DIRECTORY and its direct children, newest first."""
    entries = []
    if (directory / "manifest.yaml").is_file():
        entries.append(_checkpoint(directory, directory.name or str(directory), verify))
    with os.scandir(directory) as it:
        children = sorted(it, key=lambda d: d.name)
    for child in children:
        if not child.is_dir(follow_symlinks=False):
            continue
        path = Path(child.path)
        m = HIDDEN.match(child.name)
        if m:
            state = "incomplete" if m["kind"] == "partial" else "leftover"
            mtime, age, disk = _tree_facts(path)
            entries.append(Entry(m["name"], str(path), state, None, mtime, age, disk_bytes=disk,
                                 problem={"partial": "being written, or its writer died",
                                          "old": "replaced by --replace; removal unfinished",
                                          "deleting": "removal by prune unfinished"}[m["kind"]]))
        elif os.path.isfile(path / "manifest.yaml") and not os.path.islink(path / "manifest.yaml"):
            entries.append(_checkpoint(path, child.name, verify))
    entries.sort(key=_newest_first)
    return entries


def _newest_first(e: Entry) -> tuple[float, int, str]:
    """By creation time; a tie (older manifests have whole seconds) goes to the
    manifest written last (its mtime has nanoseconds), then to the name."""
    try:
        written = os.lstat(os.path.join(e.path, "manifest.yaml")).st_mtime_ns
    except OSError:
        written = 0
    return (-e.timestamp, -written, e.name)


def _checkpoint(path: Path, name: str, verify: bool) -> Entry:
    from ..errors import NpusnapError
    from ..image.format import MANIFEST, load_manifest, member_summary, safe_member
    from ..image.packed import verify as verify_dir

    mtime, age, disk = _tree_facts(path)
    entry = Entry(name, str(path), "invalid", None, os.lstat(path / MANIFEST).st_mtime, age, disk_bytes=disk)
    try:
        m = load_manifest(path)
    except NpusnapError as e:
        entry.problem = e.message
        return entry
    entry.created = str(m.created)
    try:
        when = datetime.fromisoformat(str(m.created))
        # A time without a zone is UTC, as npusnap writes it; never the reader's local time.
        entry.timestamp = (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
    except (ValueError, OverflowError, OSError):
        pass
    entry.pid = m.pid
    argv = [str(a) for a in m.command] if m.command else [p.comm for p in m.processes[:1]]
    entry.command = " ".join(shlex.quote(a) for a in argv) or None
    entry.bytes = sum(f.size for f in m.files)
    entry.files = len(m.files)
    entry.device = m.device.backend
    if m.parent is not None:
        entry.parent = os.path.normpath(os.path.join(os.path.abspath(path), m.parent.path))
    entry.members = [{"pid": e.pid, "files": n["files"], "bytes": n["bytes"]}
                     for e in m.members for n in [member_summary(m, e)]]
    try:
        if verify:
            verify_dir(path, m)
        else:
            for f in m.files:
                if f.chunks:
                    continue  # in the chunk store: --verify checks its chunks
                size = os.lstat(safe_member(path, f.path)).st_size
                if size != f.size:
                    raise NpusnapError(f"{f.path}: size {size} differs from the manifest's {f.size}")
    except NpusnapError as e:
        entry.problem = e.message
        return entry
    except OSError as e:
        entry.problem = f"cannot read it: {e.strerror}"
        return entry
    entry.state = "valid"
    return entry


def _tree_facts(path: Path) -> tuple[float, float, int]:
    """The newest mtime anywhere inside (nothing followed), the age that gives, and total bytes."""
    newest, total = 0.0, 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
            try:
                st = os.lstat(name)
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return newest, round(max(0.0, time.time() - newest), 1), total


@click.command(name="list")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--verify", is_flag=True, help="Recompute every checksum (slow) instead of checking sizes.")
@json_option
@click.pass_obj
def list_checkpoints(term: Terminal, directory: Path, verify: bool) -> None:
    """List the checkpoints in DIRECTORY (itself and its direct children): time, pid,
    command, size, device backend, and whether each is valid.

    Valid means the manifest loads and every image file has the size it lists;
    --verify checks the checksums too. Checkpoints still being written (or whose
    writer died) show as incomplete.
    """
    entries = scan(directory, verify)
    if term.json_mode:
        term.data("list", {"directory": str(directory.absolute()), "verified": verify,
                           "checkpoints": [e.to_dict() for e in entries]})
        return
    if not entries:
        term.info(f"no checkpoints in {directory}")
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold")
    for col in ("name", "created", "pid", "command", "size", "device", "state"):
        table.add_column(col, overflow="fold", justify="right" if col in ("pid", "size") else "left")
    notes = []
    for e in entries:
        style = {"valid": "green", "invalid": "red", "incomplete": "yellow", "leftover": "yellow"}[e.state]
        table.add_row(Text(shown(e.name)), Text(_when(e.timestamp)), Text(_pids(e)),
                      Text(shown(e.command or "-")), Text(human_bytes(e.bytes or e.disk_bytes)),
                      Text(e.device or "-"), Text(e.state, style=style))
        if e.problem:
            notes.append(Text(shown(f"{e.name}: {e.state}: {e.problem}"), style="dim"))
    term.render(table)
    for note in notes:
        term.render(note)


def _pids(e: Entry) -> str:
    """A set shows every member's pid."""
    if e.members:
        return " ".join(str(m["pid"]) for m in e.members)
    return str(e.pid) if e.pid is not None else "-"


def _when(timestamp: float) -> str:
    """Local time, to the minute: the manifest's exact ISO time is in --json."""
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")
