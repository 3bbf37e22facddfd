"""A live checkpoint's images staged in memory (`checkpoint --live`): the device export and CRIU's
dump go to a private directory on a tmpfs while the workload is stopped, and are copied to the
checkpoint's staging directory on disk (write-behind) after it resumed; the seal and the commit
come only after that copy is fsync'd, so what is in memory never looks like a checkpoint.

The extra host memory is bounded by the images' size: fits() compares the estimate (device bytes
plus the tree's resident memory) with what the tmpfs and the machine have free, and the pipeline
falls back to an ordinary --leave-running checkpoint when it would not fit.

--compress stages a direct export here too (create(), copy_out(), remove()): written to the
checkpoint's disk first and packed from there, every byte would reach the disk twice and a
compressed checkpoint could never be faster than a plain one. The chunk store takes its chunks from
the memory copy (compressed or raw, as the Chooser decides, timed against the disk), and
--leave-running imports the device memory back from it. Without room for it, the export goes to
the disk as without --compress. The directory is removed when the checkpoint is done, except after
a failed put-back, when it holds the workload's only copy of its device memory (the pipeline says
where, and `npusnap recover` takes it from there)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Optional

from ..errors import StorageProblem
from .checksums import fsync_all, start_writeback
from .format import CRIU_DIR, DEVICE_DIR

DEFAULT_DIR = Path("/dev/shm")
TMPFS_MAGIC = 0x01021994
MARGIN = 64 << 20  # left free beyond the estimate: CRIU's own images beside the pages, the page cache
SLACK = 1.1        # the estimate is of memory, the images carry headers and page maps too


def free_bytes(directory: Path) -> int:
    """What can still be written to directory's tmpfs without pushing the machine into reclaim:
    the file system's free space, and no more than the machine's available memory."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = min(free, int(line.split()[1]) << 10)
    except (OSError, ValueError, IndexError):
        pass
    return free


def room_beside(directory: Path, staged: int) -> int:
    """The memory left beside `staged` bytes of images in directory's tmpfs (0 when none): what a
    live checkpoint's device snapshot may copy aside."""
    try:
        return max(0, free_bytes(directory) - int(staged * SLACK) - MARGIN)
    except OSError:
        return 0


def why_not(directory: Path, need: int) -> Optional[str]:
    """None when `need` bytes of images can be staged in directory; else why not, in words."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return f"{directory} is not a directory"
        if _fs_type(directory) != TMPFS_MAGIC:
            return f"{directory} is not a tmpfs"
        free = free_bytes(directory)
    except OSError as e:
        return f"cannot use {directory}: {e.strerror}"
    wanted = int(need * SLACK) + MARGIN
    if wanted > free:
        return f"staging needs about {wanted >> 20} MiB in {directory}, {free >> 20} MiB free"
    return None


def _fs_type(directory: Path) -> int:
    import ctypes

    class StatFs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]

    buf = StatFs()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(directory), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(directory))
    return int(buf.f_type) & 0xFFFFFFFF


class MemStage:
    """A 0700 directory of our own on the tmpfs, with criu/ and device/ as in a checkpoint."""

    def __init__(self, under: Path) -> None:
        try:
            self.path = Path(tempfile.mkdtemp(prefix="npusnap-live-", dir=under))
            for sub in (CRIU_DIR, DEVICE_DIR):
                os.mkdir(self.path / sub, 0o700)
        except OSError as e:
            raise StorageProblem(f"cannot stage the live checkpoint in {under}: {e.strerror}",
                                 "name a tmpfs directory of your own with --live-staging") from e

    def write_behind(self, to: Path, after_each: Callable[[], None] = lambda: None) -> int:
        """Copy every staged image into the staging directory `to` (its criu/ and device/ exist),
        fsync'd; returns the bytes copied. Nothing here is trusted to be ours but the directory
        itself: only regular files are copied, none followed through a link."""
        copied, done = 0, []
        for src in sorted(p for sub in (CRIU_DIR, DEVICE_DIR) for p in (self.path / sub).rglob("*")):
            rel = src.relative_to(self.path)
            st = os.lstat(src)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(to / rel, 0o700)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise StorageProblem(f"{src} is not a regular file: the live staging was tampered with")
            copied += _copy(src, to / rel)
            done.append(to / rel)
            after_each()
        try:
            fsync_all([*done, *{p.parent for p in done}])
        except OSError as e:
            raise StorageProblem(f"writing the live checkpoint to disk failed: {e.strerror}") from e
        return copied

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def create(need: int, base: Path = DEFAULT_DIR) -> Optional[Path]:
    """--compress: a private directory in memory with room for need bytes, or None (the disk then)."""
    if why_not(base, need) is not None:
        return None
    try:
        return Path(tempfile.mkdtemp(prefix="npusnap-device-", dir=base))
    except OSError:
        return None


def copy_out(src: Path, dst: Path) -> None:
    """An image that is not compressed after all (auto): written to the checkpoint as it is, fsync'd
    (the seal takes it as checksummed: the export hashed it while streaming)."""
    dst.parent.mkdir(0o700, exist_ok=True)
    _copy(src, dst)
    fsync_all([dst])


def remove(path: Optional[Path]) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def _copy(src: Path, dst: Path) -> int:
    """One file, in the kernel (sendfile: copy_file_range refuses to cross file systems), its
    write-back started at once."""
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fin).st_size
            left = size
            while left > 0:
                n = os.sendfile(fout, fin, None, min(left, 1 << 30))
                if n == 0:
                    raise StorageProblem(f"{src} shrank while it was copied")
                left -= n
            start_writeback(fout)
        finally:
            os.close(fout)
    except OSError as e:
        raise StorageProblem(f"writing the staged images to disk failed: {e.strerror}",
                             "free space in the checkpoint's file system or choose another directory") from e
    finally:
        os.close(fin)
    return size
