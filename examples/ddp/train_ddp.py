"""Data-parallel training over N ranks joined by HCCL, weights on the (simulated) NPU.

Every rank holds one shard of a linear-regression data set and a full copy of the weights on its
device. Each step: residual and gradient of its shard as device kernels, HcclAllReduce of the
gradients (and of the loss) on the same stream, then the same momentum-SGD update on every rank.
Each rank prints its loss and a digest of its weights per step; the digests agree across ranks
and, after a checkpoint/restore of all ranks, with an uninterrupted run.

Ranks find their place the way torchrun, srun and msrun tell them: RANK/WORLD_SIZE/LOCAL_RANK,
else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, else RANK_ID/RANK_SIZE. They meet through a fresh
directory (--rendezvous, or NPUSNAP_DDP_RENDEZVOUS) where rank 0 leaves HCCL's root info.

    examples/ddp/launch.sh 4 -- --steps 200          # 4 local ranks, like torchrun
    srun -n 4 python examples/ddp/train_ddp.py --rendezvous /shared/run-$SLURM_JOB_ID
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path

import npusim
import numpy as np

ROOT_INFO = "hccl-root-info"


def placement() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the launcher's environment; a single rank without one."""
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"), ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
                              ("RANK_ID", "RANK_SIZE", "DEVICE_ID")):
        if rank in os.environ and size in os.environ:
            r = int(os.environ[rank])
            return r, int(os.environ[size]), int(os.environ.get(local, r))
    return 0, 1, 0


def root_info(rendezvous: Path, rank: int, timeout_s: float) -> bytes:
    """Rank 0 publishes HCCL's root info (written aside, then renamed: never seen half-written);
    the others wait for it, bounded."""
    path = rendezvous / ROOT_INFO
    if rank == 0:
        info = npusim.hccl_get_root_info()
        tmp = rendezvous / f".{ROOT_INFO}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(info)
        os.replace(tmp, path)
        return info
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            time.sleep(0.05)
            continue
        with os.fdopen(fd, "rb") as f:
            return f.read()
    raise SystemExit(f"rank {rank}: no {path} after {timeout_s:.0f} s (is rank 0 running?)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--sleep-ms", type=int, default=50, help="pause per step (to leave time to checkpoint)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--samples", type=int, default=1024, help="samples over all ranks")
    ap.add_argument("--rendezvous", type=Path, default=os.environ.get("NPUSNAP_DDP_RENDEZVOUS"),
                    help="a fresh directory all ranks reach (shared storage across nodes)")
    ap.add_argument("--rendezvous-timeout", type=float, default=60)
    args = ap.parse_args()
    rank, world, local = placement()
    if world > 1 and args.rendezvous is None:
        ap.error("several ranks need --rendezvous DIR (or NPUSNAP_DDP_RENDEZVOUS)")

    npusim.init()
    device = local % npusim.get_device_count()
    npusim.set_device(device)
    stream = npusim.create_stream()
    comm = (npusim.hccl_comm_init_root_info(world, root_info(args.rendezvous, rank, args.rendezvous_timeout), rank)
            if world > 1 else None)

    # The whole data set from one seed; this rank keeps rows [lo, hi).
    n, d = args.samples, args.dim
    rng = np.random.default_rng(1234)
    x_all = rng.standard_normal((n, d), dtype=np.float32)
    y_all = (x_all @ rng.standard_normal((d, 1), dtype=np.float32)).astype(np.float32)
    lo, hi = rank * n // world, (rank + 1) * n // world
    x, y, rows = x_all[lo:hi], y_all[lo:hi], hi - lo

    f4 = 4
    sizes = {"x": rows * d * f4, "xt": d * rows * f4, "y": rows * f4, "w": d * f4, "v": d * f4,
             "err": rows * f4, "grad": d * f4, "tmp": d * f4, "loss": f4}
    dev = {name: npusim.malloc(size) for name, size in sizes.items()}
    npusim.memcpy_h2d(dev["x"], np.ascontiguousarray(x))
    npusim.memcpy_h2d(dev["xt"], np.ascontiguousarray(x.T))
    npusim.memcpy_h2d(dev["y"], np.ascontiguousarray(y))
    for name in ("w", "v"):
        npusim.launch_fill(dev[name], d, 0.0, stream)
    npusim.synchronize_stream(stream)
    print(f"ready pid {os.getpid()} rank {rank}/{world} device {device}", flush=True)

    def all_reduce(name: str, count: int) -> None:
        if comm is not None:  # in place, on the step's stream: ordered with the kernels around it
            npusim.hccl_all_reduce(dev[name], dev[name], count, npusim.HCCL_DATA_TYPE_FP32,
                                   npusim.HCCL_REDUCE_SUM, comm, stream)

    lr, beta = 0.05, 0.9
    w_host = np.empty(d, dtype=np.float32)
    err_host = np.empty(rows, dtype=np.float32)
    loss_host = np.empty(1, dtype=np.float32)
    # STEP_GATE=N:PATH, for tests: hold after step N until PATH exists (at most 120 s), so that a
    # test can checkpoint the run before it ends on a slow machine; the output stays the same.
    gate_step, _, gate_path = os.environ.get("STEP_GATE", "").partition(":")
    for step in range(args.steps):
        npusim.launch_matmul(rows, 1, d, dev["x"], dev["w"], dev["err"], stream)       # err = X w - y
        npusim.launch_axpy(rows, -1.0, dev["y"], dev["err"], stream)
        npusim.launch_matmul(d, 1, rows, dev["xt"], dev["err"], dev["grad"], stream)   # grad = X^T err
        all_reduce("grad", d)                                                          # summed over ranks
        npusim.launch_fill(dev["tmp"], d, 0.0, stream)                                 # v = beta v + grad / n
        npusim.launch_axpy(d, beta, dev["v"], dev["tmp"], stream)
        npusim.launch_axpy(d, 1.0 / n, dev["grad"], dev["tmp"], stream)
        npusim.launch_copy(dev["v"], dev["tmp"], d * f4, stream)
        npusim.launch_axpy(d, -lr, dev["v"], dev["w"], stream)                         # w -= lr v
        npusim.memcpy_d2h(err_host, dev["err"], stream)
        npusim.synchronize_stream(stream)
        loss_host[0] = np.float32(np.sum(err_host.astype(np.float64) ** 2))
        npusim.memcpy_h2d(dev["loss"], loss_host)
        all_reduce("loss", 1)
        npusim.memcpy_d2h(loss_host, dev["loss"], stream)
        npusim.memcpy_d2h(w_host, dev["w"], stream)
        npusim.synchronize_stream(stream)
        digest = hashlib.sha256(w_host.tobytes()).hexdigest()[:16]
        print(f"step {step} loss {float(loss_host[0]) / n:.6f} weights {digest}", flush=True)
        time.sleep(args.sleep_ms / 1000)
        if str(step) == gate_step:
            held_until = time.monotonic() + 120
            while not os.path.exists(gate_path) and time.monotonic() < held_until:
                time.sleep(0.02)

    if comm is not None:
        npusim.hccl_comm_destroy(comm)
    print(f"done weights {hashlib.sha256(w_host.tobytes()).hexdigest()[:32]}", flush=True)


if __name__ == "__main__":
    main()
