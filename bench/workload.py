"""The benchmark's workload: a process holding a known amount of host (and device) memory.

    python bench/workload.py --host-mib 1024 --device-mib 2048 --zero-fraction 0.25
    python bench/workload.py --host-mib 256 --cpu-only        # no device runtime at all

Host memory: one numpy buffer, every page written with non-zero data. Device memory
(npusim): allocated in chunks of --chunk-mib; the first (1 - zero_fraction) of it is
filled with non-zero floats by device kernels (launch_fill), the rest is explicitly
zeroed, so a checkpoint that skips zero pages can show it. Prints one line,
`ready {json}`, describing what it holds, then idles until killed.

Run as a script (its directory is not a package root), so it imports nothing from bench.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MIB = 1 << 20


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-mib", type=int, default=1024)
    ap.add_argument("--device-mib", type=int, default=0)
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--zero-fraction", type=float, default=0.25)
    ap.add_argument("--cpu-only", action="store_true", help="do not load the device runtime")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)

    import numpy as np

    host_bytes = args.host_mib * MIB
    # arange from 1: every 8-byte word, hence every page, is non-zero.
    host = np.arange(1, host_bytes // 8 + 1, dtype=np.uint64)
    info: dict[str, object] = {
        "pid": os.getpid(),
        "host_bytes": int(host.nbytes),
        "host_addr": int(host.ctypes.data),
        "device_bytes": 0,
        "device_nonzero_bytes": 0,
        "allocations": 0,
    }

    keep: list[int] = []
    if not args.cpu_only:
        import npusim

        npusim.init()
        npusim.set_device(args.device)
        stream = npusim.create_stream()
        total = args.device_mib * MIB
        nonzero_left = int(total * (1.0 - args.zero_fraction)) // 4 * 4
        nonzero = 0
        left = total
        i = 0
        while left > 0:
            size = min(args.chunk_mib * MIB, left)
            ptr = npusim.malloc(size)
            keep.append(ptr)
            nz = min(size, nonzero_left)
            if nz:
                npusim.launch_fill(ptr, nz // 4, float(i + 1), stream)  # float(i+1) != 0: no zero byte pattern
            if size - nz:
                npusim.memset(ptr + nz, 0, size - nz, stream)
            nonzero_left -= nz
            nonzero += nz
            left -= size
            i += 1
        npusim.synchronize_stream(stream)
        info.update(device_bytes=total, device_nonzero_bytes=nonzero, allocations=len(keep))

    sys.stdout.write("ready " + json.dumps(info) + "\n")
    sys.stdout.flush()
    while True:  # idle: no output after ready, so the stdout file keeps its size for CRIU
        time.sleep(0.05)
        host[0] = host[0]  # keep the buffer referenced (and resident)


if __name__ == "__main__":
    main()
