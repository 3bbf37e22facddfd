"""A small training loop whose weights live on the (simulated) NPU.

Linear regression by momentum SGD: the data, the weights, the momentum and a
block of scratch "activation" memory are device allocations; every step runs
matmul/axpy kernels on a device stream and prints the loss and a digest of the
weights, so a checkpoint/restore that lost or changed any device byte shows up
as a different line. The last line digests all device memory.

    npusnap run -- python examples/train.py --steps 40
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import npusim
import numpy as np


def step_gate(step: int) -> None:
    """STEP_GATE=N:PATH (for tests, as tests/workloads/step_gate.h): after step N, wait until PATH
    exists (at most 120 s), so a test can checkpoint the run before it ends on a slow machine."""
    at, _, path = os.environ.get("STEP_GATE", "").partition(":")
    if at == str(step):
        for _ in range(6000):
            if os.path.exists(path):
                return
            time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sleep-ms", type=int, default=50, help="pause per step (to leave time to checkpoint)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--scratch-mb", type=int, default=64, help="extra device memory touched each step")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()

    npusim.init()
    npusim.set_device(args.device)
    stream = npusim.create_stream()
    n, d = args.samples, args.dim
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((n, d), dtype=np.float32)
    true_w = rng.standard_normal((d, 1), dtype=np.float32)
    y = (x @ true_w).astype(np.float32)

    f4 = 4
    sizes = {"x": n * d * f4, "xt": d * n * f4, "y": n * f4, "w": d * f4, "v": d * f4,
             "err": n * f4, "grad": d * f4, "tmp": d * f4, "scratch": args.scratch_mb << 20}
    dev = {name: npusim.malloc(size) for name, size in sizes.items()}
    npusim.memcpy_h2d(dev["x"], x)
    npusim.memcpy_h2d(dev["xt"], np.ascontiguousarray(x.T))
    npusim.memcpy_h2d(dev["y"], y)
    for name in ("w", "v"):
        npusim.launch_fill(dev[name], d, 0.0, stream)
    scratch_floats = (args.scratch_mb << 20) // f4
    npusim.launch_fill(dev["scratch"], scratch_floats, 1.0, stream)
    npusim.synchronize_stream(stream)
    print(f"ready pid {os.getpid()} device {args.device}", flush=True)

    lr, beta = 0.05, 0.9
    w_host = np.empty(d, dtype=np.float32)
    err_host = np.empty(n, dtype=np.float32)
    for step in range(args.steps):
        npusim.launch_matmul(n, 1, d, dev["x"], dev["w"], dev["err"], stream)   # err = X w
        npusim.launch_axpy(n, -1.0, dev["y"], dev["err"], stream)              # err -= y
        npusim.launch_matmul(d, 1, n, dev["xt"], dev["err"], dev["grad"], stream)  # grad = X^T err
        npusim.launch_fill(dev["tmp"], d, 0.0, stream)                         # v = beta v + grad / n
        npusim.launch_axpy(d, beta, dev["v"], dev["tmp"], stream)
        npusim.launch_axpy(d, 1.0 / n, dev["grad"], dev["tmp"], stream)
        npusim.launch_copy(dev["v"], dev["tmp"], d * f4, stream)
        npusim.launch_axpy(d, -lr, dev["v"], dev["w"], stream)                 # w -= lr v
        npusim.launch_axpy(scratch_floats, 0.5, dev["scratch"], dev["scratch"], stream)  # scratch *= 1.5
        npusim.memcpy_d2h(err_host, dev["err"], stream)
        npusim.memcpy_d2h(w_host, dev["w"], stream)
        npusim.synchronize_stream(stream)  # an async copy is only queued until the stream is synchronized
        loss = float(np.mean(err_host.astype(np.float64) ** 2))
        digest = hashlib.sha256(w_host.tobytes()).hexdigest()[:16]
        print(f"step {step} loss {loss:.6f} weights {digest}", flush=True)
        time.sleep(args.sleep_ms / 1000)
        step_gate(step)

    h = hashlib.sha256()
    for name, ptr in dev.items():
        buf = np.empty(sizes[name] // f4, dtype=np.float32)
        npusim.memcpy_d2h(buf, ptr)
        h.update(buf.tobytes())
    print(f"done device-digest {h.hexdigest()[:32]}", flush=True)


if __name__ == "__main__":
    main()
