"""Readahead of the device images while the runtime re-creates its allocations.

A direct-path restore first has the restored runtime re-create its device allocations (`restore
external`: committing and zeroing device memory, CPU work) and only then has the daemon read the
images into them. From a cold disk, the disk idles during the first step. Prefetch asks the
kernel (POSIX_FADV_WILLNEED, in steps, on a thread of its own) to read the head of the images
meanwhile, so the import starts on cached data while its own readahead takes over from there.
Only a window: readahead of whole images would compete with the reads that gate the restore.
Nothing is trusted or handed over here: the import still verifies every byte it reads."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Iterable, Optional

STEP = 8 << 20     # bytes per readahead request: small enough to stop soon when asked
WINDOW = 256 << 20  # about what a disk reads while the runtime re-creates a few GiB of allocations


def _available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Prefetch:
    """Context manager: starts reading ahead the named files of directory (in that order, at most
    `limit` bytes and a quarter of the available memory) on entry; stops asking on exit."""

    def __init__(self, directory: Path, names: Iterable[str], limit: int = WINDOW) -> None:
        self.directory = directory
        self.names = [n for n in names if n and "/" not in n and n not in (".", "..")]
        self.limit = min(limit, _available() // 4)
        self.requested = 0  # bytes asked for (for tests)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="image-prefetch", daemon=True)

    def __enter__(self) -> "Prefetch":
        if self.names and self.limit > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        try:
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # the import finds the problem and says what it is
        try:
            for name in self.names:
                if self.stop.is_set() or self.requested >= self.limit:
                    return
                fd = self._open(dfd, name)
                if fd is None:
                    continue
                try:
                    size = os.fstat(fd).st_size
                    offset = 0
                    while offset < size and not self.stop.is_set() and self.requested < self.limit:
                        n = min(STEP, size - offset, self.limit - self.requested)
                        os.posix_fadvise(fd, offset, n, os.POSIX_FADV_WILLNEED)
                        offset += n
                        self.requested += n
                except OSError:
                    pass  # only a hint
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)

    @staticmethod
    def _open(dfd: int, name: str) -> Optional[int]:
        """A regular file, opened without following links (O_NONBLOCK: a FIFO planted in its
        place cannot hang us), else None."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
        os.close(fd)
        return None
