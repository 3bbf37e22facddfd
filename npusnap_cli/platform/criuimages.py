"""CRIU's image files, read without pycriu.images (its import alone costs more than the whole
dump of a small process): the dumped tree, whether a process was stopped, where each page image's
bytes belong, whether any INET socket was dumped. criu/include/magic.h, images/*.proto."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ..errors import CriuFailed
from . import criurpc


def dumped_tree(images_dir: Path) -> list[tuple[int, int, int]]:
    """The tree CRIU froze and dumped, from its pstree.img: (pid, ppid, threads) per
    process, root first. It, not a /proc listing taken before the freeze, is what the
    dump holds: children forked in between are in it."""
    try:
        entries = [_fields(e) for e in _image_entries(_read_image(images_dir / "pstree.img"), PSTREE_MAGIC)]
        tree = [(_int(e, 1), _int(e, 2, 0), len(_ints(e, 5)) or 1) for e in entries]
    except OSError as e:
        raise CriuFailed(f"CRIU wrote no readable pstree.img: {e.strerror}") from e
    except ValueError as e:
        raise CriuFailed(f"cannot read CRIU's pstree.img: {e}") from e
    if not tree:
        raise CriuFailed("cannot read CRIU's pstree.img: no process in it")
    return tree


def stopped_at_dump(images_dir: Path, pids: list[int]) -> bool:
    """Whether any of these processes was stopped (SIGSTOP) when it was dumped (its core image's
    task_state). Raises ValueError on an image it cannot read."""
    for pid in pids:
        [core] = _image_entries(_read_image(images_dir / f"core-{pid}.img"), CORE_MAGIC)
        task_core = _fields(core).get(3)  # core_entry.tc
        if task_core and isinstance(task_core[0], bytes) and _int(_fields(task_core[0]), 1) == TASK_STOPPED:
            return True
    return False


def holds_inet_sockets(images_dir: Path) -> bool:
    """Whether the dump's files.img lists an INET socket (file_entry.type, field 1, INETSK), the
    only kind whose TCP connections CRIU locks: no, and a tree that runs on after its dump needs
    no network unlock, nor pycriu's image definitions to decode the image. Unsure (an image that
    does not parse): yes. No files.img: no."""
    try:
        entries = _image_entries(_read_image(images_dir / "files.img"), FILES_MAGIC)
        return any(_int(_fields(e), 1, FD_INETSK) == FD_INETSK for e in entries)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True


def page_runs(images_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Where each page image's bytes belong: pages-N.img -> [(vaddr, bytes)] of the runs of
    pages it holds, in file order, from the pagemap images (a head naming pages_id, then one
    entry per run; only runs flagged PE_PRESENT are in the file). Raises ValueError on an image
    it cannot read."""
    runs: dict[str, list[tuple[int, int]]] = {}
    for name in sorted(os.listdir(images_dir)):
        if not (name.startswith("pagemap") and name.endswith(".img")):
            continue
        head, *entries = _image_entries(_read_image(images_dir / name), PAGEMAP_MAGIC)
        mine = runs.setdefault(f"pages-{_int(_fields(head), 1)}.img", [])
        for raw in entries:
            e = _fields(raw)
            flags = _int(e, 4, -1)
            present = not _int(e, 3, 0) if flags < 0 else bool(flags & PE_PRESENT)
            if present:
                mine.append((_int(e, 1), _int(e, 5, _int(e, 2)) * PAGE_SIZE))
    return runs


PSTREE_MAGIC, CORE_MAGIC, PAGEMAP_MAGIC, FILES_MAGIC = 0x50273030, 0x55053847, 0x56084025, 0x56303138
FD_INETSK = 4  # images/fdinfo.proto: fd_types
PE_PRESENT = 1 << 2  # criu/include/pagemap.h: the run's pages are in the pages image
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_LEADING_MAGICS = (0x54564319, 0x55105940)  # IMG_COMMON_MAGIC, IMG_SERVICE_MAGIC: the image's own magic follows
TASK_STOPPED = 3  # compel/include/uapi/task-state.h


def _read_image(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _image_entries(data: bytes, magic: int) -> list[bytes]:
    """An image's entries (each a serialized protobuf message). Raises ValueError on a bad image."""
    found, pos = int.from_bytes(data[:4], "little"), 4
    if found in _LEADING_MAGICS:
        found, pos = int.from_bytes(data[4:8], "little"), 8
    if found != magic or len(data) < pos:
        raise ValueError(f"not the image expected (magic {found:#x})")
    entries = []
    while pos < len(data):
        size = int.from_bytes(data[pos:pos + 4], "little")
        body = data[pos + 4:pos + 4 + size]
        if pos + 4 > len(data) or len(body) != size:
            raise ValueError("truncated entry")
        entries.append(body)
        pos += 4 + size
    return entries


def _fields(msg: bytes) -> dict[int, list[Any]]:
    """A protobuf message as {field number: [values]}: varints and fixed-width fields as int,
    length-delimited ones (messages, bytes, packed repeated fields) as bytes."""
    fields: dict[int, list[Any]] = {}
    for number, wire, raw in criurpc.raw_fields(msg):
        value = int.from_bytes(raw, "little") if wire in (1, 5) else raw
        fields.setdefault(number, []).append(value)
    return fields


def _ints(fields: dict[int, list[Any]], number: int) -> list[int]:
    """A repeated varint field, packed or not."""
    out = []
    for v in fields.get(number, []):
        if isinstance(v, bytes):
            pos = 0
            while pos < len(v):
                n, pos = criurpc.read_varint(v, pos)
                out.append(n)
        else:
            out.append(v)
    return out


def _int(fields: dict[int, list[Any]], number: int, default: Optional[int] = None) -> int:
    values = _ints(fields, number)
    if values:
        return values[-1]
    if default is None:
        raise ValueError(f"field {number} is missing")
    return default
