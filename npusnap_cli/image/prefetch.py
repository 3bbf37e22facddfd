"""Readahead of images that are read later in a restore, started while earlier steps run.

A direct-path restore reads the device images only after CRIU has restored the tree and the
runtime has re-created its allocations; from a cold disk, those steps leave the disk idle while
they do CPU work. Prefetch asks the kernel (POSIX_FADV_WILLNEED, in steps, on a thread of its
own) to read the device images into the page cache from the start, so the import later finds
them there. Nothing is trusted or handed over here: the reader still verifies every byte as it
reads (the daemon's import). Bounded: at most `limit` bytes, and never more than a quarter of
the memory available when it starts, so it cannot push the page cache out from under CRIU."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Iterable, Optional

from .format import FileEntry, safe_member

STEP = 8 << 20  # bytes per readahead request: small enough to stop soon when asked


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
    """Context manager: starts reading the entries' files ahead on entry, stops on exit."""

    def __init__(self, root: Path, entries: Iterable[FileEntry], limit: int = 2 << 30) -> None:
        self.root = root
        self.entries = list(entries)
        self.limit = min(limit, _available() // 4)
        self.requested = 0  # bytes asked for (for tests and timings)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="image-prefetch", daemon=True)

    def __enter__(self) -> "Prefetch":
        if self.entries and self.limit > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        for entry in self.entries:
            fd = self._open(entry)
            if fd is None:
                continue  # the reader finds the problem and says what it is
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
            if self.stop.is_set() or self.requested >= self.limit:
                return

    def _open(self, entry: FileEntry) -> Optional[int]:
        """A regular file inside the checkpoint, opened without following links (O_NONBLOCK:
        a FIFO planted in its place cannot hang us), else None."""
        try:
            path = safe_member(self.root, entry.path)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except Exception:
            return None
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
        os.close(fd)
        return None
