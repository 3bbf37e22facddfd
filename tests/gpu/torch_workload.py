"""A PyTorch workload for the real-GPU check (tests/gpu/run_gpu_check.sh).

Holds about --gib GiB of float32 tensors on the GPU and takes deterministic steps on them;
prints one digest of *all* its tensors per step, and a byte-exact SHA-256 of them at the end.

    python torch_workload.py --steps 40 --gib 2 --sleep-ms 250

The per-step digest is computed on the GPU with integer arithmetic (exact and order-independent):
every tensor viewed as int32 words, multiplied by a position weight and summed in int64 (wrapping).
Two runs print the same lines iff they computed the same bits.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch


def digest(tensors: list[torch.Tensor], weights: torch.Tensor) -> str:
    acc = 0
    for i, t in enumerate(tensors):
        words = t.view(torch.int32).to(torch.int64)
        s = int((words * weights).sum().item()) + i * 0x9E3779B97F4A7C15
        acc = (acc * 1000003 ^ s) & 0xFFFFFFFFFFFFFFFF
    return f"{acc:016x}"


def full_sha256(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--sleep-ms", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_workload: CUDA is not available to PyTorch", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    chunk = 64 << 20  # elements per tensor: 256 MiB of float32
    count = max(1, int(a.gib * (1 << 30) / (chunk * 4)))
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    tensors = [torch.rand(chunk, generator=gen, device=dev, dtype=torch.float32) for _ in range(count)]
    weights = (torch.arange(chunk, device=dev, dtype=torch.int64) % 65521) + 1
    torch.cuda.synchronize()
    print(f"ready pid {os.getpid()} tensors {count} x {chunk * 4 >> 20} MiB on {torch.cuda.get_device_name(dev)}",
          flush=True)
    for step in range(a.steps):
        # Elementwise only (deterministic on every GPU): each tensor is mixed with its neighbour.
        for i, t in enumerate(tensors):
            other = tensors[(i + 1) % count]
            t.mul_(0.75).add_(torch.sin(other * 3.0 + step)).remainder_(4.0)
        torch.cuda.synchronize()
        print(f"step {step} {digest(tensors, weights)}", flush=True)
        time.sleep(a.sleep_ms / 1000)
    print(f"final sha256 {full_sha256(tensors)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
