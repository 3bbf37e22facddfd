"""A Python CPU workload for checkpoint tests: each step mutates a 64 MiB buffer
and prints a digest of all of it.  usage: mutate.py STEPS SLEEP_MS [EXIT_CODE]"""

import hashlib
import sys
import time

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
sleep_s = (int(sys.argv[2]) if len(sys.argv) > 2 else 100) / 1000
code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
buf = bytearray(range(256)) * ((64 << 20) // 256)  # every page real, not zero
x = 12345
for step in range(steps):
    for _ in range(256):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        buf[x % len(buf)] ^= x & 0xFF
    print(f"step {step} digest {hashlib.blake2b(buf, digest_size=8).hexdigest()}", flush=True)
    time.sleep(sleep_s)
print("done", flush=True)
sys.exit(code)
