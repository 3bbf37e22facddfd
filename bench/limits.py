"""Physical limits of this machine, measured in the same run as everything else:

* memcpy       single-thread copy bandwidth (numpy copyto of pre-faulted buffers)
* disk write   sequential write in 8 MiB chunks + fsync, in the benchmark's work directory
* disk read    the same file after fdatasync + POSIX_FADV_DONTNEED (or drop_caches): cold
* tmpfs        the same write and read on /dev/shm (in memory: a second memcpy-like limit)

All rates in bytes per second, median over the repeats."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .util import drop_all_caches, evict, median

CHUNK = 8 << 20


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


def write_file(path: Path, nbytes: int, fsync: bool = True) -> float:
    buf = memoryview(bytes([0xA5]) * CHUNK)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[:min(CHUNK, left)])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return nbytes / (time.perf_counter() - t)


def read_file(path: Path) -> float:
    buf = bytearray(CHUNK)
    n = 0
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                n += k
    finally:
        os.close(fd)
    return n / (time.perf_counter() - t)


def storage_rates(directory: Path, nbytes: int, repeat: int, cold: bool) -> dict[str, Any]:
    """fsync'd write rate and (cold, if asked) read rate of a file of nbytes in directory."""
    path = directory / "limits.bin"
    writes, reads = [], []
    evicted = True
    try:
        for _ in range(repeat):
            with_unlink(path)
            writes.append(write_file(path, nbytes))
            if cold:
                evicted = evict(path) and evicted
                drop_all_caches()
            reads.append(read_file(path))
    finally:
        with_unlink(path)
    return {"write": median(writes), "read": median(reads), "write_samples": writes,
            "read_samples": reads, "evicted": evicted}


def with_unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def measure(disk_dir: Path, tmpfs_dir: Path, nbytes: int, repeat: int) -> dict[str, Any]:
    memcpy, memcpy_samples = memcpy_rate(nbytes, repeat)
    disk = storage_rates(disk_dir, nbytes, repeat, cold=True)
    tmpfs = storage_rates(tmpfs_dir, nbytes, repeat, cold=False)
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
