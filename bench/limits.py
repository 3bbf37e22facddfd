"""Physical limits of this machine, measured in the same run as everything else:

* memcpy       single-thread copy bandwidth (numpy copyto of pre-faulted buffers)
* disk write   sequential write in 8 MiB chunks + fsync, in the benchmark's work directory, its
               write-back started every 32 MiB and the window three back waited for and dropped, as
               the device export writes (a write that fills the page cache first is throttled: on
               the development VM 0.36-1.42 GiB/s for 1 GiB and 0.37-0.44 for 4-7, windowed 1.31-1.63)
* disk read    the file after fdatasync + POSIX_FADV_DONTNEED (or drop_caches): cold; the best
               of one such file read by 1 thread and another by 8 (LimitFiles says why)
* tmpfs        the same write and read on /dev/shm (in memory: a second memcpy-like limit)

All rates in bytes per second, median over the repeats. bench/device.py measures the storage
limits again in each of its samples, on files of the sample's image size (LimitFiles)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .util import drop_all_caches, evict, median

CHUNK = 8 << 20
WINDOW = 32 << 20
READERS = (1, 8)  # threads reading a file for the disk's read limit: the best of them is kept (LimitFiles)


def memcpy_rate(nbytes: int, repeat: int) -> tuple[float, list[float]]:
    import numpy as np

    src = np.full(nbytes // 8, 0x5A5A5A5A5A5A5A5A, dtype=np.uint64)
    dst = np.ones_like(src)  # written once: every page faulted in before timing
    np.copyto(dst, src)
    samples = []
    for _ in range(max(3, repeat)):
        t = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - t)
    rates = [src.nbytes / s for s in samples]
    return median(rates), rates


def write_file(path: Path, nbytes: int, windowed: bool = False) -> float:
    """Write and fsync nbytes; windowed (a disk): write-back in 32 MiB windows as it goes."""
    from npusnap_cli.image.checksums import start_writeback, wait_writeback

    buf = memoryview(bytes([0xA5]) * CHUNK)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done, window = 0, WINDOW
        while done < nbytes:
            done += os.write(fd, buf[:min(CHUNK, nbytes - done)])
            while windowed and done >= window:
                start_writeback(fd, window - WINDOW, WINDOW)
                if window >= 3 * WINDOW:
                    old = window - 3 * WINDOW
                    wait_writeback(fd, old, WINDOW)
                    os.posix_fadvise(fd, old, WINDOW, os.POSIX_FADV_DONTNEED)
                window += WINDOW
        os.fsync(fd)
    finally:
        os.close(fd)
    return nbytes / (time.perf_counter() - t)


def read_file(path: Path, threads: int = 1) -> float:
    """Read the whole file in CHUNK pieces, by threads threads taking every threads-th piece, each
    dropped from the page cache once read: the cache never grows, as the restore's import keeps it
    (on this VM memory not touched lately costs a fault in its host: a 7 GiB file, 8 readers,
    1.15 and 1.25 GiB/s so, 0.86 and 1.22 into a growing cache)."""
    import threading

    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDONLY)
    errors: list[OSError] = []

    def work(first: int) -> None:
        buf = bytearray(CHUNK)
        try:
            for offset in range(first * CHUNK, size, threads * CHUNK):
                os.preadv(fd, [buf], offset)
                os.posix_fadvise(fd, offset, CHUNK, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            errors.append(e)

    t = time.perf_counter()
    try:
        pool = [threading.Thread(target=work, args=(i,)) for i in range(1, threads)]
        for th in pool:
            th.start()
        work(0)
        for th in pool:
            th.join()
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return size / (time.perf_counter() - t)


class LimitFiles:
    """The storage limits on files of nbytes in directory: write() writes them and returns the best
    rate, read() reads them back (cold, on a disk), removes them and returns the best rate. On a
    disk there is one file per READERS entry, read by that many threads, as neither wins always on
    this VM: 10 s after a 1 GiB file was written one reader took 0.47-0.92 GiB/s of it, eight
    2.11-2.21 (two 0.95-1.68, four 1.14-2.11, sixteen 1.87-2.10), while files of 1.75 GiB read
    once a restore was done gave one reader 2.1-2.7 and eight 1.2-1.4. A tmpfs has one, read by
    one thread."""

    def __init__(self, directory: Path, stem: str, nbytes: int, disk: bool) -> None:
        self.nbytes, self.disk = nbytes, disk
        self.paths = {n: directory / f"{stem}-{n}.bin" for n in (READERS if disk else (1,))}

    def write(self) -> float:
        rates = []
        for path in self.paths.values():
            with_unlink(path)
            rates.append(write_file(path, self.nbytes, windowed=self.disk))
        return max(rates)

    def read(self, reverse: bool = False) -> dict[str, Any]:
        """{"read": the best rate, "evicted", "by_readers": {threads: rate}}; reverse: the files in
        the other order (the first read is of the younger data)."""
        try:
            rates: dict[str, float] = {}
            evicted = True
            for n, path in sorted(self.paths.items(), reverse=reverse):
                if self.disk:
                    evicted = evict(path) and evicted
                    drop_all_caches()
                rates[str(n)] = read_file(path, n)
            return {"read": max(rates.values()), "evicted": evicted, "by_readers": rates}
        finally:
            self.remove()

    def remove(self) -> None:
        for path in self.paths.values():
            with_unlink(path)


def sample(directory: Path, nbytes: int, disk: bool) -> dict[str, Any]:
    """One fsync'd write and one read of LimitFiles of nbytes in directory, removed after: {"write",
    "read" (the best, bytes per second), "evicted", "by_readers"}."""
    files = LimitFiles(directory, "limits", nbytes, disk)
    try:
        return {"write": files.write(), **files.read()}
    finally:
        files.remove()


def storage_rates(directory: Path, nbytes: int, repeat: int, disk: bool) -> dict[str, Any]:
    """Median fsync'd write rate and read rate of a file of nbytes in directory (sample())."""
    samples = [sample(directory, nbytes, disk) for _ in range(repeat)]
    writes, reads = [s["write"] for s in samples], [s["read"] for s in samples]
    return {"write": median(writes), "read": median(reads), "write_samples": writes,
            "read_samples": reads, "evicted": all(s["evicted"] for s in samples)}


def with_unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def measure(disk_dir: Path, tmpfs_dir: Path, nbytes: int, repeat: int) -> dict[str, Any]:
    memcpy, memcpy_samples = memcpy_rate(nbytes, repeat)
    disk = storage_rates(disk_dir, nbytes, repeat, disk=True)
    tmpfs = storage_rates(tmpfs_dir, nbytes, repeat, disk=False)
    return {
        "bytes": nbytes,
        "memcpy_Bps": memcpy,
        "disk_write_fsync_Bps": disk["write"],
        "disk_read_cold_Bps": disk["read"],
        "tmpfs_write_Bps": tmpfs["write"],
        "tmpfs_read_Bps": tmpfs["read"],
        "disk_cache_evicted": disk["evicted"],
        "samples": {"memcpy": memcpy_samples, "disk_write": disk["write_samples"],
                    "disk_read": disk["read_samples"], "tmpfs_write": tmpfs["write_samples"],
                    "tmpfs_read": tmpfs["read_samples"]},
    }
