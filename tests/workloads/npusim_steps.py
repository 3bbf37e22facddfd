"""A Python workload on npusim that knows nothing of npusnap (no agent; for `attach` and the
cuda backend): each step queues two axpy kernels on its own stream, copies back and prints a
digest. usage: npusim_steps.py STEPS SLEEP_MS [HEAVY]; HEAVY > 0 also queues a HEAVY^3 matmul
per step (device work that takes long to drain: the lock-timeout case)."""
import hashlib
import os
import sys
import time
from pathlib import Path

import npusim
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train import step_gate  # noqa: E402  (STEP_GATE, as the training example honours it)

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
    step_gate(step)
npusim.memcpy_d2h(host, a)
print(f"done {hashlib.sha256(host.tobytes()).hexdigest()[:16]}", flush=True)
