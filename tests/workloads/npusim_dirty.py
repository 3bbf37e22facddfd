"""A workload on npusim that changes a known tenth of its device memory per step (incremental
checkpoints, tests/pipeline/test_incremental.py). usage: npusim_dirty.py STEPS GATE_DIR|- [floats]

64 MiB of random device memory in 4 allocations; step k first waits for GATE_DIR/go-K (bounded;
"-": no waiting), then writes 6 MiB of new data into one allocation (a host copy) and fills
256 KiB of another (a device task): 7 of 64 chunks of 1 MiB. Then it prints the digest of all
its device memory, so a restored run that differs in any byte prints other lines.
floats: the data is training state instead of random bytes (weights and optimizer moments as
float32 holding bf16-precision values, as mixed-precision training keeps them: compressible,
about 2x with zstd, but not zeros)."""
import hashlib
import os
import sys
import time

import npusim
import numpy as np

MiB = 1 << 20
steps, gate = int(sys.argv[1]), sys.argv[2]
floats = sys.argv[3:] == ["floats"]


def data(seed: int, nbytes: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if not floats:
        return rng.integers(0, 256, nbytes, dtype=np.uint8)
    scale = (0.02, 1e-3, 1e-6)[seed % 3]  # weights, first and second moments
    a = rng.standard_normal(nbytes // 4, dtype=np.float32) * np.float32(scale)
    return (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.uint8)


npusim.init()
npusim.set_device(0)
bufs = [npusim.malloc(16 * MiB) for _ in range(4)]
for i, b in enumerate(bufs):
    npusim.memcpy_h2d(b, data(i, 16 * MiB))
print(f"ready pid {os.getpid()}", flush=True)
host = np.empty(16 * MiB, dtype=np.uint8)
for step in range(steps):
    deadline = time.monotonic() + 120
    while gate != "-" and not os.path.exists(os.path.join(gate, f"go-{step}")) and time.monotonic() < deadline:
        time.sleep(0.01)
    new = data(1000 + step, 6 * MiB)
    npusim.memcpy_h2d(bufs[step % 4] + (step // 4 % 2) * 8 * MiB, new)
    npusim.launch_fill(bufs[(step + 1) % 4] + 15 * MiB, (256 << 10) // 4, float(step))
    npusim.synchronize_device()
    h = hashlib.blake2b(digest_size=8)
    for b in bufs:
        npusim.memcpy_d2h(host, b)
        h.update(host.tobytes())
    print(f"step {step} {h.hexdigest()}", flush=True)
print("done", flush=True)
