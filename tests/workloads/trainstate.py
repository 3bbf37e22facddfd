"""Training-like host state for the chunk store tests: weights and Adam's two moments as float32
arrays holding bf16-precision values (as mixed-precision training keeps them; random, not zeros).
SIGUSR1 takes a "step" that rewrites 1% of each array (the next slice each time); SIGUSR2
prints `digest N HEX` over all of them.  usage: trainstate.py MIB"""

import hashlib
import signal
import sys
import time

import numpy as np

n = (int(sys.argv[1]) << 20) // 4 // 3
rng = np.random.default_rng(7)


def bf16(a: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


state = [bf16(rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)),
         bf16(rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)),
         bf16(np.abs(rng.standard_normal(n, dtype=np.float32)) * np.float32(1e-6))]
todo = {"step": 0, "digest": 0}
steps = digests = 0


def ask(what: str):
    def handler(signum: int, frame: object) -> None:
        todo[what] += 1
    return handler


signal.signal(signal.SIGUSR1, ask("step"))
signal.signal(signal.SIGUSR2, ask("digest"))
print("ready", flush=True)
for _ in range(10 ** 6):  # bounded: the tests signal and kill it long before
    while todo["step"]:
        todo["step"] -= 1
        k = n // 100
        start = (steps * k) % (n - k)
        for a in state:  # in place: no temporary array, whose pages would count as changed memory too
            part = a[start:start + k]
            part *= np.float32(0.9)
            part += np.float32(1e-4)
            bits = part.view(np.uint32)
            bits &= np.uint32(0xFFFF0000)
        steps += 1
        print(f"stepped {steps}", flush=True)
    while todo["digest"]:
        todo["digest"] -= 1
        h = hashlib.blake2b(digest_size=16)
        for a in state:
            h.update(a)  # no copy (a copy's pages would be changed memory)
        digests += 1
        print(f"digest {digests} {h.hexdigest()}", flush=True)
    time.sleep(0.02)
