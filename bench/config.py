"""Size presets. Every measurement is repeated `repeat` times and its median reported.

A preset sweeps two sizes: the host RSS of a CPU-only process (bare CRIU against npusnap)
and the device memory of a device workload (npusnap against the disk's and memory's limits),
so the plot shows how each cost grows with size. --host-sizes/--device-sizes replace a
preset's lists; sizes that do not fit the machine are skipped with the reason printed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Optional

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Sizes:
    name: str
    cpu_bytes: list[int]           # the CPU-only process's sizes (bare CRIU vs npusnap)
    host_bytes: int                # host memory of the device workload
    device_bytes: list[int] = field(default_factory=list)  # D values of the device workload
    limit_bytes: int = 256 * MIB   # buffer/file size for the physical limits
    repeat: int = 3
    pings: int = 1000
    helps: int = 10
    zero_fraction: float = 0.25    # share of device memory left zero (for elision)
    plot: bool = False
    budget: Optional[float] = None  # seconds for the whole run (samples beyond the first are cut to fit)
    tiny_bytes: int = 1 * MIB      # a tiny CPU-only process: npusnap's fixed cost over bare CRIU
    # bench/incremental.py: (device, host) memory of the workload checkpointed twice, a tenth of
    # each changed in between: a 4 GiB job, as bench-lazy's, whose device memory outweighs its host
    # memory, as training's does (at 1 GiB + 128 MiB a checkpoint's fixed ~0.2 s, Python's start
    # and CRIU's kernel probes, is most of the second one's time: README).
    incremental: tuple[int, int] = (3584 * MIB, 512 * MIB)
    live_bytes: int = 512 * MIB     # bench/live.py's device memory (the downtime's fixed part, CRIU's
                                    # freeze and parasite, is a quarter of a 256 MiB checkpoint)


PRESETS = {
    "tiny": Sizes("tiny", cpu_bytes=[16 * MIB], host_bytes=16 * MIB, device_bytes=[16 * MIB],
                  limit_bytes=32 * MIB, repeat=1, pings=200, helps=3, incremental=(32 * MIB, 16 * MIB),
                  live_bytes=32 * MIB),
    "quick": Sizes("quick", cpu_bytes=[64 * MIB, 256 * MIB], host_bytes=256 * MIB, device_bytes=[256 * MIB],
                   limit_bytes=256 * MIB, repeat=3, budget=110),
    # --profile: where a device checkpoint's and restore's time goes, phase by phase (nothing else runs)
    "profile": Sizes("profile", cpu_bytes=[], host_bytes=1 * GIB, device_bytes=[1 * GIB],
                     limit_bytes=256 * MIB, repeat=3),
    "full": Sizes("full", cpu_bytes=[64 * MIB, 256 * MIB, 1 * GIB, 4 * GIB], host_bytes=1 * GIB,
                  device_bytes=[256 * MIB, 1 * GIB, 2 * GIB, 4 * GIB, 8 * GIB],
                  limit_bytes=1 * GIB, repeat=3, plot=True, budget=1500),
}

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB}


def parse_size(text: str) -> int:
    """'256M', '1GiB', '64m' -> bytes (binary units; a bare number is bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (say 64M, 256MiB, 1G)")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n < MIB:
        raise ValueError(f"size {text!r} is under 1 MiB")
    return n


def parse_sizes(text: str) -> list[int]:
    """'64M,256M,1G' -> sorted distinct byte counts."""
    return sorted({parse_size(part) for part in text.split(",") if part.strip()})


def with_sizes(sizes: Sizes, cpu: Optional[list[int]], device: Optional[list[int]]) -> Sizes:
    return replace(sizes, cpu_bytes=cpu or sizes.cpu_bytes, device_bytes=device or sizes.device_bytes)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} B"
