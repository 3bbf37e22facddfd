"""Device images staged in memory on their way into the chunk store (--compress).

The daemon writes a direct export as fast as it can into the files it is handed; written to
the checkpoint's disk first and packed from there, every byte would reach the disk twice and a
compressed checkpoint could never be faster than a plain one. So with --compress the export
goes to a private directory in /dev/shm (tmpfs: memory), the store takes its chunks from there
(compressed or raw, as the Chooser decides, timed against the disk: only what it stores is
written), and --leave-running imports the device memory back from that copy. It is used only
when the tmpfs has room for the whole export (the device bytes, and a margin); otherwise the
export goes to the disk as without --compress, and is packed from there.

The directory is ours (mkdtemp: 0700, a fresh name); it is removed when the checkpoint is done,
except after a failed put-back, when it holds the workload's only copy of its device memory
(the pipeline says where, and `npusnap recover` takes it from there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

SHM = Path("/dev/shm")
MARGIN = 64 << 20  # left free for everyone else


def room(base: Path, need: int) -> bool:
    try:
        st = os.statvfs(base)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= need + MARGIN


def create(need: int, base: Path = SHM) -> Optional[Path]:
    """A private directory in memory with room for need bytes, or None (the disk then)."""
    if not room(base, need):
        return None
    try:
        return Path(tempfile.mkdtemp(prefix="npusnap-device-", dir=base))
    except OSError:
        return None


def copy_out(src: Path, dst: Path) -> None:
    """An image that is not compressed after all (auto): written to the checkpoint as it is, fsync'd
    (the seal takes it as checksummed: the export hashed it while streaming)."""
    dst.parent.mkdir(0o700, exist_ok=True)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with open(src, "rb") as f:
            while os.sendfile(fd, f.fileno(), None, 1 << 30) > 0:
                pass
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Optional[Path]) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
