"""Checksums computed in the pass that moves the data, never in a pass of their own.

Checkpoint: a Follower hashes CRIU's images while CRIU writes them, from the page cache where
the bytes still are, on a thread of its own (xxhash and preadv release the GIL), and has their
write-back started as it goes (sync_file_range, on another thread: it blocks while the disk's
queue is full), so the disk is busy from the first page and the seal only hashes the last few
bytes and waits for the flush. CRIU writes every image front to back and never goes back over
what it wrote; a file replaced under the same name (a new inode: a retried dump) or shrunk is
hashed again from its start.

Restore: BulkVerifier checks the page images (the bulk of a checkpoint, pure memory contents)
while CRIU reads them; see core/restore.py for why that is safe (the restored tree stays
stopped until the verdict). It also asks the kernel to read them ahead (image/prefetch.py): once
CRIU outruns the verifier (huge pages fill several times faster than 4 KiB ones), CRIU's own
reads would otherwise go to the disk in readahead's small steps, at half its rate or less.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..errors import ImageInvalid
from .format import PAGES, FileEntry, hash_fd, new_hasher, safe_member

SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
_libc: Optional[Any] = None


def _sync_file_range(fd: int, offset: int, length: int, flags: int) -> None:
    import ctypes  # here: ~3 ms of imports, first needed once CRIU writes (not before its request)

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    _libc.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(length), flags)


def start_writeback(fd: int, offset: int = 0, length: int = 0) -> None:
    """sync_file_range(SYNC_FILE_RANGE_WRITE): begin writing dirty pages (length 0: to EOF), without waiting."""
    _sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)


def wait_writeback(fd: int, offset: int = 0, length: int = 0) -> None:
    """Wait until the file's dirty pages (length 0: to EOF) are on the disk (its data only: fsync
    still owes the metadata and the disk's cache flush)."""
    _sync_file_range(fd, offset, length,
                     SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER)


class _Writeback:
    """Starts the write-back of ranges of files, in order, on a thread of its own. The call
    (SYNC_FILE_RANGE_WRITE) blocks while the disk's queue is full: 30-45 ms for a 100 MiB range
    on the development VM, which on the hashing thread held the hashing back until the seal.
    Each range holds a duplicate of its file's descriptor, closed once done or dropped."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: list[tuple[int, int, int]] = []  # (descriptor, offset, length)
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="image-writeback", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def ask(self, fd: int, offset: int, length: int) -> None:
        with self.cond:
            if not self.closed:
                self.pending.append((os.dup(fd), offset, length))
                self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.closed:
                    self.cond.wait()
                if not self.pending:
                    return
                fd, offset, length = self.pending.pop(0)
            try:
                start_writeback(fd, offset, length)
            except OSError:
                pass  # only a head start: the seal's fsync writes and checks it all
            finally:
                os.close(fd)

    def close(self) -> None:
        """Drop what has not started (the seal's fsync writes it anyway); wait for the call under way."""
        with self.cond:
            self.closed = True
            dropped, self.pending = self.pending, []
            self.cond.notify()
        for fd, _, _ in dropped:
            os.close(fd)
        if self.thread.is_alive():
            self.thread.join()


@dataclass
class _Tail:
    """A file being followed while it is written: how far it has been hashed."""

    fd: int
    inode: int
    hasher: Any
    offset: int = 0


class Follower:
    """Context manager around the writing of one directory (flat: CRIU's images). On exit the
    thread stops; digests() then catches up to each file's end and returns what it hashed. A
    round that found BEHIND bytes or more is followed by the next at once: a follower behind
    CRIU catches up rather than sleeping between rounds.

    Each followed file's descriptor stays open until digests(): it pins the inode, so a file
    replaced under its name is always told apart (a new inode number). At most max_files are
    followed (a big process tree writes thousands of images; descriptors are bounded); the
    seal hashes the others itself."""

    BEHIND = 1 << 20  # bytes hashed in a round that say more are waiting: no sleep before the next

    def __init__(self, directory: Path, interval: float = 0.02, max_files: int = 256,
                 skip: Optional[re.Pattern[str]] = None) -> None:
        self.max_files = max_files
        self.skip = skip  # names not followed: they move to the chunk store, hashed as they go (store.py)
        self.directory = directory
        self.interval = interval
        self.tails: dict[str, _Tail] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="image-hasher", daemon=True)
        self.writeback = _Writeback()
        self.failed: Optional[BaseException] = None

    def __enter__(self) -> "Follower":
        self.writeback.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopped.set()
        self.thread.join()
        if exc[0] is not None:
            self.close()  # the writing failed: no seal will ask for digests

    def _run(self) -> None:
        try:
            busy = False
            while not self.stopped.wait(0 if busy else self.interval):
                busy = self.catch_up(final=False) >= self.BEHIND
        except BaseException as e:  # never fatal here: digests() hashes whatever is left from scratch
            self.failed = e
            self.close()

    def catch_up(self, final: bool) -> int:
        """Hash every file's new bytes; returns how many. While CRIU runs (not final) an error on
        one file only drops it (it is hashed again at the end)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        for name in set(self.tails) - set(names):
            self._drop(name)  # removed (a failed attempt's images)
        hashed = 0
        for name in names:
            try:
                hashed += self._follow(name, final)
            except OSError:
                if final:
                    raise
                self._drop(name)
        return hashed

    def _follow(self, name: str, final: bool) -> int:
        if self.skip is not None and self.skip.fullmatch(name):
            return 0
        path = self.directory / name
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return 0
        tail = self.tails.get(name)
        if tail is not None and (tail.inode != st.st_ino or st.st_size < tail.offset):
            self._drop(name)  # replaced or truncated: start over
            tail = None
        if tail is None:
            if len(self.tails) >= self.max_files:
                return 0
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            if os.fstat(fd).st_ino != st.st_ino:
                os.close(fd)
                return 0  # replaced between the two calls: next round
            tail = self.tails[name] = _Tail(fd, st.st_ino, new_hasher())
        end = os.fstat(tail.fd).st_size
        if end <= tail.offset:
            return 0
        done = hash_fd(tail.fd, tail.hasher, tail.offset, end)
        if not final:  # the seal's fsync, next, writes the rest
            self.writeback.ask(tail.fd, tail.offset, done)
        tail.offset += done
        return done

    def _drop(self, name: str) -> None:
        tail = self.tails.pop(name, None)
        if tail is not None:
            os.close(tail.fd)

    def digests(self) -> dict[str, tuple[int, str]]:
        """After the writer finished (and the context exited): name -> (size, checksum) of every
        regular file in the directory, each read to its end. The descriptors are closed."""
        assert self.stopped.is_set()
        try:
            self.catch_up(final=True)
            return {name: (t.offset, t.hasher.hexdigest()) for name, t in self.tails.items()}
        finally:
            self.close()

    def close(self) -> None:
        self.writeback.close()
        for name in list(self.tails):
            self._drop(name)


def page_entries(manifest: Any) -> list[FileEntry]:
    """The manifest's CRIU page images (criu/pages-N.img, a set member's criu/PID/pages-N.img): the
    process memory, most of the bytes."""
    return [f for f in manifest.files if PAGES.fullmatch(f.path)]


class BulkVerifier:
    """Checks the checksums of the given manifest entries on a thread, while someone else
    (CRIU) reads the same files: one read from the disk serves both. result() waits and raises
    ImageInvalid for the first mismatch."""

    def __init__(self, root: Path, entries: Iterable[FileEntry],
                 check: Callable[[Path, FileEntry], None], read_ahead: bool = True) -> None:
        self.root = root
        self.entries = list(entries)
        self.bytes = sum(e.size for e in self.entries)
        self.check = check
        self.read_ahead = read_ahead  # not for a lazy restore: its first touches need the disk
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="image-verifier", daemon=True)

    def start(self) -> "BulkVerifier":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            with contextlib.ExitStack() as ahead:
                if self.read_ahead:
                    self._read_ahead(ahead)
                for entry in self.entries:
                    self.check(safe_member(self.root, entry.path), entry)
        except BaseException as e:
            self.error = e

    def _read_ahead(self, stack: contextlib.ExitStack) -> None:
        """Every file, whole, in order: one Prefetch per directory (a set's processes, each
        restored by a CRIU restorer of its own, read theirs at once); they stop with the check."""
        from .prefetch import Prefetch

        by_dir: dict[str, list[FileEntry]] = {}
        for e in self.entries:
            by_dir.setdefault(os.path.dirname(e.path), []).append(e)
        for rel, entries in by_dir.items():
            stack.enter_context(Prefetch(safe_member(self.root, rel), [os.path.basename(e.path) for e in entries],
                                         limit=sum(e.size for e in entries)))

    def result(self) -> None:
        self.thread.join()
        if isinstance(self.error, ImageInvalid):
            raise self.error
        if self.error is not None:
            raise ImageInvalid(f"cannot verify the checkpoint's images: {self.error}") from self.error


def fsync_all(paths: list[Path], threads: int = 8) -> None:
    """fsync every path, on a few threads at once; the first error is raised once all are done."""
    todo = list(reversed(paths))
    errors: list[OSError] = []

    def work() -> None:
        while True:
            try:
                p = todo.pop()
            except IndexError:
                return
            try:
                fsync_path(p)
            except OSError as e:
                errors.append(e)

    pool = [threading.Thread(target=work, name="fsync", daemon=True) for _ in range(min(threads, len(paths)) - 1)]
    for t in pool:
        t.start()
    work()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
