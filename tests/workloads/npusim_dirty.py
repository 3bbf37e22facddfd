"""A workload on npusim that changes a known tenth of its device memory per step (incremental
checkpoints, tests/pipeline/test_incremental.py). usage: npusim_dirty.py STEPS GATE_DIR|-

64 MiB of random device memory in 4 allocations; step k first waits for GATE_DIR/go-K (bounded;
"-": no waiting), then writes 6 MiB of new data into one allocation (a host copy) and fills
256 KiB of another (a device task): 7 of 64 chunks of 1 MiB. Then it prints the digest of all
its device memory, so a restored run that differs in any byte prints other lines."""
import hashlib
import os
import sys
import time

import npusim
import numpy as np

MiB = 1 << 20
steps, gate = int(sys.argv[1]), sys.argv[2]
npusim.init()
npusim.set_device(0)
bufs = [npusim.malloc(16 * MiB) for _ in range(4)]
for i, b in enumerate(bufs):
    npusim.memcpy_h2d(b, np.random.default_rng(i).integers(0, 256, 16 * MiB, dtype=np.uint8))
print(f"ready pid {os.getpid()}", flush=True)
host = np.empty(16 * MiB, dtype=np.uint8)
for step in range(steps):
    deadline = time.monotonic() + 120
    while gate != "-" and not os.path.exists(os.path.join(gate, f"go-{step}")) and time.monotonic() < deadline:
        time.sleep(0.01)
    new = np.random.default_rng(1000 + step).integers(0, 256, 6 * MiB, dtype=np.uint8)
    npusim.memcpy_h2d(bufs[step % 4] + (step // 4 % 2) * 8 * MiB, new)
    npusim.launch_fill(bufs[(step + 1) % 4] + 15 * MiB, (256 << 10) // 4, float(step))
    npusim.synchronize_device()
    h = hashlib.blake2b(digest_size=8)
    for b in bufs:
        npusim.memcpy_d2h(host, b)
        h.update(host.tobytes())
    print(f"step {step} {h.hexdigest()}", flush=True)
print("done", flush=True)
