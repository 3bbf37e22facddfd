"""Incremental checkpoints: a checkpoint taken with `--parent DIR` holds only the device chunks
written since its parent's export and references the rest, which may lie further up the chain
(native/npusim/export.h). The manifest names its parent (format.ParentRef): the directory
relative to this one, and the parent manifest's checksum line, so a parent replaced since is
refused instead of silently mixed in.

    ancestors(root, m)   the chain above a checkpoint, parent first, each manifest checked
    verify_chain(...)    every link's manifest, tree and files (device files by size, or fully)
    parent_ref(...)      what a new checkpoint records of its parent
    referenced(...)      the checkpoints a set of kept ones needs (prune never breaks a chain)
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterable, Optional

from ..errors import ImageInvalid
from .format import CRIU_DIR, DEVICE_DIR, MANIFEST, MANIFEST_CHECKSUM_KEY, Manifest, ParentRef, load_manifest
from .packed import assembled, verify

MAX_CHAIN = 32  # the daemon's kMaxDepth: a chunk is never referenced further up than this


def manifest_checksum(root: Path) -> str:
    """The checksum line of root's manifest (load_manifest has checked it)."""
    last = (root / MANIFEST).read_text().rstrip("\n").rpartition("\n")[2]
    key, _, digest = last.partition(":")
    if key != MANIFEST_CHECKSUM_KEY:
        raise ImageInvalid(f"{root / MANIFEST} has no {MANIFEST_CHECKSUM_KEY} line (incomplete or edited)")
    return digest.strip()


def parent_dir(root: Path, m: Manifest) -> Optional[Path]:
    """The parent checkpoint's directory, as the manifest names it (not following a symlink)."""
    if m.parent is None:
        return None
    p = Path(os.path.normpath(os.path.join(os.path.abspath(root), m.parent.path)))
    try:
        st = os.lstat(p)
    except OSError:
        raise ImageInvalid(f"{root}: its parent checkpoint {p} is missing",
                           "an incremental checkpoint needs its whole chain; restore a complete one") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ImageInvalid(f"{root}: its parent checkpoint {p} is not a directory (a symlink is not followed)")
    return p


def ancestors(root: Path, m: Manifest) -> list[tuple[Path, Manifest]]:
    """The checkpoints root's device images may reference, parent first: at most MAX_CHAIN,
    each the very one its child recorded (manifest checksum), all of the same process."""
    out: list[tuple[Path, Manifest]] = []
    seen = {os.path.abspath(root)}
    child, cm = root, m
    while cm.parent is not None and len(out) < MAX_CHAIN:
        p = parent_dir(child, cm)
        assert p is not None
        if str(p) in seen:
            raise ImageInvalid(f"{child}: its chain of parents loops back to {p}")
        seen.add(str(p))
        pm = load_manifest(p)
        if manifest_checksum(p) != cm.parent.manifest_checksum:
            raise ImageInvalid(f"{child}: its parent {p} is not the checkpoint it was taken against "
                               "(replaced or rewritten since)", "restore a complete checkpoint")
        if not same_processes(m, pm):
            raise ImageInvalid(f"{child}: its parent {p} is not a checkpoint of "
                               + (f"the same set ({_pids(m)})" if m.is_set else f"process {m.pid}"))
        out.append((p, pm))
        child, cm = p, pm
    return out


def verify_chain(root: Path, m: Manifest, deep: bool = True) -> list[tuple[Path, Manifest]]:
    """Every link above root checked like a checkpoint of its own: manifest, tree, every file's
    size, and (deep) every checksum. Otherwise (restore, checkpoint --parent) sizes suffice: only
    the links' device chunks are used (their host pages never are: not looked up in the chunk
    store), and the daemon checks each one it takes."""
    chain = ancestors(root, m)
    for p, pm in chain:
        try:
            verify(p, pm, shallow=() if deep else (CRIU_DIR, DEVICE_DIR), deep=deep, pages=deep)
        except ImageInvalid as e:
            raise ImageInvalid(f"{p} (link of the chain of {root}): {e.message}", e.hint) from e
    return chain


def _pids(m: Manifest) -> str:
    return ", ".join(str(p) for p in sorted(e.pid for e in m.members))


def same_processes(m: Manifest, pm: Manifest) -> bool:
    """Whether pm is a checkpoint of the same process as m, or (a set) of the same members."""
    if m.is_set:
        return pm.is_set and sorted(e.pid for e in pm.members) == sorted(e.pid for e in m.members)
    return not pm.is_set and pm.pid == m.pid


def check_set_parent(parent: Path, pids: Iterable[int]) -> tuple[Manifest, list[tuple[Path, Manifest]]]:
    """`checkpoint PID PID ... --parent` (and a job's node): the parent must be a complete,
    unaltered direct checkpoint of a set of exactly these processes, with its chain intact."""
    pm = load_manifest(parent)
    want = sorted(pids)
    have = sorted(e.pid for e in pm.members) if pm.is_set else [pm.pid]
    if not pm.is_set or have != want:
        raise ImageInvalid(f"{parent} is a checkpoint of process{'es' if len(have) > 1 else ''} "
                           f"{', '.join(map(str, have))}, not of the set {', '.join(map(str, want))}: "
                           "it cannot be its parent", "name a checkpoint of the same processes, or take a full one")
    indirect = [e.pid for e in pm.members if e.device.method != "direct"]
    if indirect:
        raise ImageInvalid(f"{parent} holds no direct device images of process {indirect[0]} "
                           f"(data path {next(e for e in pm.members if e.pid == indirect[0]).device.method}): "
                           "it cannot be a parent", "take a full checkpoint with the direct data path first")
    verify(parent, pm, shallow=(CRIU_DIR, DEVICE_DIR), deep=False, pages=False)
    return pm, verify_chain(parent, pm, deep=False)


def device_dirs(chain: Iterable[tuple[Path, Manifest]]) -> list[Path]:
    return [p / DEVICE_DIR for p, _ in chain]


def device_views(stack: contextlib.ExitStack, chain: Iterable[tuple[Path, Manifest]]) -> list[Path]:
    """The links' device directories as the daemon reads them: a link compressed into the chunk
    store (--compress) reassembled in a private directory (each chunk checked) until stack closes."""
    views = []
    for p, pm in chain:
        try:
            views.append(stack.enter_context(assembled(p, pm, DEVICE_DIR)))
        except ImageInvalid as e:
            raise ImageInvalid(f"{p} (link of a chain): {e.message}", e.hint) from e
    return views


def check_parent(parent: Path, pid: int) -> tuple[Manifest, list[tuple[Path, Manifest]]]:
    """`checkpoint --parent`: the parent must be a complete, unaltered direct checkpoint of this
    same process, with its chain intact; returns its manifest and its own ancestors."""
    pm = load_manifest(parent)
    if pm.is_set:
        raise ImageInvalid(f"{parent} is a process set's checkpoint: it cannot be a parent",
                           "incremental checkpoints are for one process")
    if pm.pid != pid:
        raise ImageInvalid(f"{parent} is a checkpoint of process {pm.pid}, not {pid}: it cannot be its parent",
                           "name a checkpoint of the same process, or take a full one (no --parent)")
    if pm.device.method != "direct":
        raise ImageInvalid(f"{parent} holds no direct device images (data path {pm.device.method}): "
                           "it cannot be a parent", "take a full checkpoint with the direct data path first")
    # Sizes only: the daemon checks the parent's index, and each chunk keeps its hash.
    verify(parent, pm, shallow=(CRIU_DIR, DEVICE_DIR), deep=False, pages=False)
    return pm, verify_chain(parent, pm, deep=False)


def parent_ref(final: Path, parent: Path) -> ParentRef:
    """What a checkpoint that will live at final records of its parent."""
    rel = os.path.relpath(os.path.abspath(parent), os.path.abspath(final))
    return ParentRef(rel, manifest_checksum(parent))


def referenced(kept: Iterable[Path]) -> set[str]:
    """Every checkpoint (absolute path) that a kept one's chain needs, the kept ones included.
    A kept checkpoint whose chain cannot be read keeps what can be read of it."""
    need: set[str] = set()
    for root in kept:
        need.add(os.path.abspath(root))
        try:
            m = load_manifest(root)
            child, cm = root, m
            for _ in range(MAX_CHAIN):
                p = parent_dir(child, cm)
                if p is None:
                    break
                need.add(str(p))
                cm = load_manifest(p)
                child = p
        except ImageInvalid:
            continue
    return need
