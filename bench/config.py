"""Size presets. Every measurement is repeated `repeat` times and its median reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Sizes:
    name: str
    cpu_bytes: int                 # S: the CPU-only process (bare CRIU vs npusnap)
    host_bytes: int                # host memory of the device workload
    device_bytes: list[int] = field(default_factory=list)  # D values
    limit_bytes: int = 256 * MIB   # buffer/file size for the physical limits
    repeat: int = 3
    pings: int = 1000
    helps: int = 10
    zero_fraction: float = 0.25    # share of device memory left zero (for elision)
    plot: bool = False
    budget: Optional[float] = None  # seconds for the whole run (samples beyond the first are cut to fit)
    tiny_bytes: int = 1 * MIB      # a tiny CPU-only process: npusnap's fixed cost over bare CRIU


PRESETS = {
    "tiny": Sizes("tiny", cpu_bytes=16 * MIB, host_bytes=16 * MIB, device_bytes=[16 * MIB],
                  limit_bytes=32 * MIB, repeat=1, pings=200, helps=3),
    "quick": Sizes("quick", cpu_bytes=256 * MIB, host_bytes=256 * MIB, device_bytes=[256 * MIB],
                   limit_bytes=256 * MIB, repeat=3, budget=95),
    "full": Sizes("full", cpu_bytes=1 * GIB, host_bytes=1 * GIB, device_bytes=[1 * GIB, 2 * GIB, 4 * GIB],
                  limit_bytes=1 * GIB, repeat=3, plot=True, budget=780),
}


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} B"
