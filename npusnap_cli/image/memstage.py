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
the memory copy (compressed or raw, as auto's race against the disk decides: codecs.py), and
--leave-running imports the device memory back from it. Without room for it, the export goes to
the disk as without --compress; so it does under auto once the chunk store's remembered verdict
says plain wins there (store.py: Verdict). The directory is removed when the checkpoint is done, except after
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
from .codecs import TMPFS_MAGIC, fs_type
from .format import CRIU_DIR, DEVICE_DIR

DEFAULT_DIR = Path("/dev/shm")
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
        if fs_type(directory) != TMPFS_MAGIC:
            return f"{directory} is not a tmpfs"
        free = free_bytes(directory)
    except OSError as e:
        return f"cannot use {directory}: {e.strerror}"
    wanted = int(need * SLACK) + MARGIN
    if wanted > free:
        return f"staging needs about {wanted >> 20} MiB in {directory}, {free >> 20} MiB free"
    return None


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
                try:
                    os.mkdir(to / rel, 0o700)
                except FileExistsError:  # a set member's device/PID/, where its snapshot was written
                    if not stat.S_ISDIR(os.lstat(to / rel).st_mode):
                        raise
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


def remove(path: Optional[Path]) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def _copy(src: Path, dst: Path) -> int:
    return send(src, dst)


def send(src: Path, dst: Path, upto: int = -1, then: Callable[[int], None] = start_writeback,
         new: bool = True, check: Callable[[], None] = lambda: None) -> int:
    """src's bytes from dst's end on (new: dst is created, and must not exist), upto that many
    (-1: all the rest), copied in the kernel (sendfile: copy_file_range refuses to cross file
    systems); then(dst's descriptor) after (default: its write-back started), check() between
    pieces. Returns how many bytes."""
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if new else 0) | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
        try:
            off = os.lseek(fout, 0, os.SEEK_END)
            left = os.fstat(fin).st_size - off
            left = left if upto < 0 else min(upto, left)
            sent = 0
            while left > 0:
                check()
                n = os.sendfile(fout, fin, off + sent, min(left, 64 << 20))
                if n == 0:
                    raise StorageProblem(f"{src} shrank while it was copied")
                start_writeback(fout, off + sent, n)  # the disk writes while we copy on
                sent += n
                left -= n
            then(fout)
        finally:
            os.close(fout)
    except OSError as e:
        raise StorageProblem(f"writing the staged images to disk failed: {e.strerror}",
                             "free space in the checkpoint's file system or choose another directory") from e
    finally:
        os.close(fin)
    return sent
