"""npusim host<->device copy bandwidth, beside memcpy measured in the same run.

A software device is only faithful if moving data to it costs about what the
hardware path would: a plain memory copy. The copies run in a child process
(a real client of a private daemon), with numpy arrays as the host side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .device import start_daemon
from .util import Resources, child_env

_CHILD = r"""
import json, sys, time
import numpy as np
import npusim
nbytes, repeat = int(sys.argv[1]), int(sys.argv[2])
npusim.init(); npusim.set_device(0)
host = np.full(nbytes // 4, 1.5, dtype=np.float32)
back = np.empty_like(host)
dev = npusim.malloc(nbytes)
npusim.memcpy_h2d(dev, host); npusim.memcpy_d2h(back, dev)  # warm: pages faulted on both sides
out = {"h2d": [], "d2h": []}
for _ in range(repeat):
    t = time.perf_counter(); npusim.memcpy_h2d(dev, host); out["h2d"].append(nbytes / (time.perf_counter() - t))
    t = time.perf_counter(); npusim.memcpy_d2h(back, dev); out["d2h"].append(nbytes / (time.perf_counter() - t))
assert np.array_equal(host, back)
npusim.free(dev)
print(json.dumps(out))
"""


def measure(res: Resources, workdir: Path, nbytes: int, repeat: int) -> dict[str, Any]:
    sock, _ = start_daemon(res, workdir, memory=nbytes + (64 << 20))
    r = subprocess.run([sys.executable, "-c", _CHILD, str(nbytes), str(max(3, repeat))],
                       env=child_env({"NPUSIM_SOCKET": sock}), capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"npusim copy benchmark failed: {r.stderr.strip()[-300:]}")
    samples = json.loads(r.stdout)
    return {"bytes": nbytes, **{f"{k}_Bps": sorted(v)[len(v) // 2] for k, v in samples.items()},
            "samples": samples}
