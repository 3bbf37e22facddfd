"""Compression of the chunk store's chunks (--compress), and auto's race against the disk.

Light enough for the CLI to import at start: the codec libraries and the thread pool are imported
when first used.

auto never waits for the codec. Worker threads (the codecs release the GIL) compress the chunks
ahead of the writer; the writer, paced by the disk (store.Pacer: it waits for the write-back of
what it wrote a few MiB before), takes each chunk compressed if its compression is done when the
chunk's turn comes, and stores it as it is otherwise. On a disk slower than the codecs the writer
waits on the disk and finds every chunk compressed (fewer bytes to write: faster); on a disk
faster than them it runs ahead and stores most chunks raw, at the disk's own speed, so compressing
makes a checkpoint smaller but never slower. A checkpoint directory on a tmpfs is written to
memory, which no codec outruns: auto does not compress there at all (effective()). zstd and lz4,
named, compress every chunk (on the same threads) and are waited for."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional

COMPRESS = ("auto", "zstd", "lz4", "none")
AUTO_CODEC = "zstd"  # level 1: ~2x on a training state, at a few hundred MB/s a core
TMPFS_MAGIC = 0x01021994

_local = threading.local()  # a compressor per thread: zstandard's are not to be shared


def compress(codec: str, data: Any) -> bytes:
    if codec == "zstd":
        c = getattr(_local, "zstd", None)
        if c is None:
            import zstandard

            c = _local.zstd = zstandard.ZstdCompressor(level=1)
        return bytes(c.compress(data))
    if codec == "lz4":
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    return bytes(data)


def decompress(codec: str, data: bytes, size: int) -> bytes:
    if codec == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompress(data, max_output_size=size))
    if codec == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(data))
    return data


def fs_type(directory: Path) -> int:
    """statfs's f_type of the file system holding directory."""
    import ctypes

    class StatFs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]

    buf = StatFs()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(directory), ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(directory))
    return int(buf.f_type) & 0xFFFFFFFF


def effective(choice: str, directory: Path) -> str:
    """The compression a checkpoint into directory gets: auto is none where the checkpoint is
    written to memory (a tmpfs), the choice as given everywhere else."""
    if choice != "auto":
        return choice
    try:
        return "none" if fs_type(directory.absolute().parent) == TMPFS_MAGIC else choice
    except OSError:
        return choice


def workers() -> int:
    """Compressing threads: the CPUs this process may run on (the writer mostly waits on the disk)."""
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except OSError:
        return 1


class _Job:
    __slots__ = ("data", "out", "state")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.out: Any = None
        self.state = _WAITING


_WAITING, _RUNNING, _DONE = range(3)


class Race:
    """One packer's codec threads. submit() queues a chunk; taken() is the writer's turn for it:
    its bytes compressed when that is done and smaller (a named codec: waited for, or compressed
    by the writer itself if no thread started it), or None when it goes to the disk as it is.

    The threads take the newest chunk first: the one the writer reaches last. In order they would
    always be working on the chunk the writer is about to pass, and a writer faster than the codec
    would find none done; newest first, they finish the chunks ahead of it, as many as they can."""

    def __init__(self, choice: str) -> None:
        self.auto = choice == "auto"
        self.codec = AUTO_CODEC if self.auto else choice
        self.cond = threading.Condition()
        self.todo: deque[_Job] = deque()
        self.threads: list[threading.Thread] = []
        self.closing = False
        self.busy = 0  # chunks being compressed now
        self.taken_bytes = 0   # raw bytes of the chunks stored compressed
        self.passed_bytes = 0  # raw bytes of the chunks auto stored raw (their compression not done in time)
        self.done = [0, 0, 0.0]  # compressed by the threads: raw bytes, their compressed bytes, seconds

    def submit(self, data: bytes | memoryview) -> _Job:
        job = _Job(data)
        with self.cond:
            if not self.threads:
                self.threads = [threading.Thread(target=self._work, name="compress", daemon=True)
                                for _ in range(workers())]
                for t in self.threads:
                    t.start()
            self.todo.append(job)
            self.cond.notify()
        return job

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.todo and not self.closing:
                    self.cond.wait()
                if self.closing:
                    return
                job = self.todo.pop()
                job.state = _RUNNING
                self.busy += 1
            t = time.perf_counter()
            try:
                out: Any = compress(self.codec, job.data)
            except Exception as e:  # handed to the writer, which raises it (a named codec) or stores raw
                out = e
            with self.cond:
                job.out, job.state = out, _DONE
                self.busy -= 1
                if not isinstance(out, Exception):
                    self.done[0] += len(job.data)
                    self.done[1] += len(out)
                    self.done[2] += time.perf_counter() - t
                self.cond.notify_all()

    def taken(self, job: _Job) -> Optional[bytes]:
        size = len(job.data)
        with self.cond:
            if job.state == _WAITING:
                self.todo.remove(job)  # the oldest: at the far end from where the threads take
            elif not self.auto:
                while job.state != _DONE:
                    self.cond.wait()
        if job.state != _DONE:
            if self.auto:  # never waited for; a running one's result is dropped
                self.passed_bytes += size
                return None
            job.out = compress(self.codec, job.data)
        out = job.out
        if isinstance(out, Exception):
            if self.auto:
                self.passed_bytes += size
                return None
            raise out
        if len(out) >= size:
            return None  # incompressible: stored as it is
        self.taken_bytes += size
        return bytes(out)

    def pays(self, disk_rate: float) -> bool:
        """auto's verdict after its probe: whether compressing beats writing raw to a disk that
        took disk_rate bytes a second. The race writes while the threads compress, so a byte
        costs the slower of the two: compressing (the threads' rate) and writing what it leaves;
        a margin, since a slower checkpoint is the one thing auto must not make."""
        measured = self.measured()
        if measured is None or disk_rate <= 0:
            return False
        rate, ratio = measured
        return max(1 / rate, ratio / disk_rate) < 0.8 / disk_rate

    def measured(self) -> Optional[tuple[float, float]]:
        """The threads' rate together (bytes/s) and ratio (compressed/raw) so far; None before any."""
        raw, out, secs = self.done
        if not raw:
            return None
        return len(self.threads) * raw / max(secs, 1e-9), out / raw

    def settle(self) -> None:
        """Wait until the threads have compressed everything submitted."""
        with self.cond:
            while self.todo or self.busy:
                self.cond.wait()

    def drop(self, job: _Job) -> None:
        """A chunk not stored after all: not compressed if not started."""
        with self.cond:
            if job.state == _WAITING:
                self.todo.remove(job)

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.todo.clear()
            self.cond.notify_all()
        for t in self.threads:
            t.join()
        self.threads = []
