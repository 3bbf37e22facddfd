"""A workload on npusim for lazy restores (tests/pipeline/test_lazy.py).
usage: npusim_lazy.py STEPS GATE_DIR|-

48 MiB of random device memory in 3 allocations and 32 MiB of random host memory. Step k waits
for GATE_DIR/go-K (bounded; "-": no waiting), then reads one 1 MiB chunk of device memory, the
last chunk of allocation k % 3 first (what a lazy restore has not brought in yet), adds it into
the host memory and prints the digests of that chunk and of all host memory. The last line digests
all device memory. A device access that fails prints `acl error CODE` and exits 3."""
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
bufs = [npusim.malloc(16 * MiB) for _ in range(3)]
for i, b in enumerate(bufs):
    npusim.memcpy_h2d(b, np.random.default_rng(i).integers(0, 256, 16 * MiB, dtype=np.uint8))
host = np.random.default_rng(99).integers(0, 256, 32 * MiB, dtype=np.uint8)
chunk = np.empty(MiB, dtype=np.uint8)
print(f"ready pid {os.getpid()}", flush=True)


def digest(a: np.ndarray) -> str:
    return hashlib.blake2b(a.tobytes(), digest_size=8).hexdigest()


try:
    for step in range(steps):
        deadline = time.monotonic() + 120
        while gate != "-" and not os.path.exists(os.path.join(gate, f"go-{step}")) and time.monotonic() < deadline:
            time.sleep(0.01)
        npusim.memcpy_d2h(chunk, bufs[step % 3] + (15 - step // 3 % 16) * MiB)
        host[step * MiB % host.size:][:MiB] += chunk
        print(f"step {step} {digest(chunk)} {digest(host)}", flush=True)
    whole = np.empty(16 * MiB, dtype=np.uint8)
    h = hashlib.blake2b(digest_size=8)
    for b in bufs:
        npusim.memcpy_d2h(whole, b)
        h.update(whole.tobytes())
    print(f"device {h.hexdigest()}", flush=True)
except npusim.AclError as e:
    print(f"acl error {e.code}", flush=True)
    sys.exit(3)
print("done", flush=True)
