"""Plumbing for the cuda backend's end-to-end tests against the test shim (native/cudashim)."""

from __future__ import annotations

import sys
from typing import Optional

from npusnap_cli import native
from tests.conftest import installed

SHIM = installed(native.NATIVE_DIR / "testing" / "libcuda.so.1")


def sim_uuid(index: int) -> str:
    """The shim's UUID for npusim device `index`."""
    return f"GPU-4e505553-494d-0000-0000-{index:012x}"


# A Python workload on npusim that knows nothing of npusnap: no agent, only the runtime (whose
# control listener serves the shim). Each step queues kernels on its own stream, copies back and
# prints a digest. usage: WORKLOAD STEPS SLEEP_MS [HEAVY]; HEAVY > 0 also queues a HEAVY^3 matmul
# per step (device work that takes long to drain: the lock-timeout case).
WORKLOAD = r"""
import hashlib, os, sys, time
import numpy as np
import npusim

steps, sleep_ms = int(sys.argv[1]), int(sys.argv[2])
heavy = int(sys.argv[3]) if len(sys.argv) > 3 else 0
npusim.init()
npusim.set_device(0)
s = npusim.create_stream()
n = 1 << 16
a, b = npusim.malloc(n * 4), npusim.malloc(n * 4)
npusim.memcpy_h2d(a, np.arange(n, dtype=np.float32) / n)
npusim.launch_fill(b, n, 1.0, s)
if heavy:
    m = npusim.malloc(heavy * heavy * 4)
    mc = npusim.malloc(heavy * heavy * 4)
    npusim.launch_fill(m, heavy * heavy, 0.5, s)
npusim.synchronize_stream(s)
print(f"ready pid {os.getpid()}", flush=True)
host = np.empty(n, dtype=np.float32)
for step in range(steps):
    npusim.launch_axpy(n, 0.5, a, b, s)     # b += a / 2
    npusim.launch_axpy(n, -0.25, b, a, s)   # a -= b / 4
    if heavy:
        npusim.launch_matmul(heavy, heavy, heavy, m, m, mc, s)
    npusim.memcpy_d2h(host, b, s)
    npusim.synchronize_stream(s)
    print(f"step {step} {hashlib.sha256(host.tobytes()).hexdigest()[:16]}", flush=True)
    time.sleep(sleep_ms / 1000)
npusim.memcpy_d2h(host, a)
print(f"done {hashlib.sha256(host.tobytes()).hexdigest()[:16]}", flush=True)
"""


def workload_argv(steps: int, sleep_ms: int, heavy: int = 0) -> list[str]:
    return [sys.executable, "-c", WORKLOAD, str(steps), str(sleep_ms), str(heavy)]


def strip_ready(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


def shim_env(base: dict[str, str], **extra: Optional[str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != "LD_PRELOAD"}
    env["NPUSNAP_LIBCUDA"] = str(SHIM)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
