"""Incremental device checkpoints: a workload with D bytes of random npusim device memory is
checkpointed (--leave-running, full), then rewrites a tenth of it and is checkpointed again
with --parent. Reported: both checkpoints' device bytes on disk and times, and the ratios
second/first (the issue's figure: at most 0.15 of the bytes): for the whole command, for the
checkpoint's phases, and for the backup (the device export) alone."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .util import BenchError, Resources, child_env, npusnap, npusnap_exe, start_workload

CHANGED = 0.1

WORKLOAD = r"""
import json, os, sys, time
import numpy as np
import npusim

size, gate = int(sys.argv[1]), sys.argv[2]
npusim.init()
npusim.set_device(0)
buf = npusim.malloc(size)
npusim.memcpy_h2d(buf, np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8))
print("ready " + json.dumps({"device_bytes": size}), flush=True)
deadline = time.monotonic() + 600
while not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.01)
n = int(size * float(sys.argv[3]))
npusim.memcpy_h2d(buf + size // 3, np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8))
npusim.synchronize_device()
print("changed", flush=True)
time.sleep(600)
"""


def _backup_s(data: dict[str, Any]) -> float:
    """The backup phase: the device export, where the incremental one saves its writes."""
    return sum(float(p["seconds"]) for p in data.get("phases", []) if p.get("name") == "backup")


def _phases_s(data: dict[str, Any]) -> float:
    """lock + backup + dump + seal: the checkpoint proper (--leave-running's device restore after
    the commit reads the whole device back either way, and is not among them)."""
    return sum(float(p["seconds"]) for p in data.get("phases", []))


def _device_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in (ckpt / "device").iterdir())


def measure(res: Resources, workdir: Path, device_bytes: int) -> dict[str, Any]:
    from npusnap_cli.platform import simdaemon

    sock = str(workdir / "incr.sock")  # sun_path is short
    res.daemons.append(sock)  # stopped with everything else
    simdaemon.start(sock, devices=1, memory=2 * device_bytes + (64 << 20))
    env = child_env({"NPUSIM_SOCKET": sock})
    script = workdir / "incremental_workload.py"
    script.write_text(WORKLOAD)
    gate = workdir / "incremental.go"
    out = workdir / "incremental.out"
    argv = [*npusnap_exe(), "run", "--", sys.executable, str(script), str(device_bytes), str(gate), str(CHANGED)]
    w = start_workload(res, argv, out, env=env)
    first, second = workdir / "incr-0", workdir / "incr-1"
    try:
        full = npusnap(["checkpoint", w.pid, "-D", first, "--leave-running", "--data-path", "direct"],
                       env=env, workdir=workdir)
        gate.touch()
        deadline = time.monotonic() + 120
        while "changed" not in out.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise BenchError("the incremental workload did not change its memory in 120 s")
            time.sleep(0.02)
        incr = npusnap(["checkpoint", w.pid, "-D", second, "--leave-running", "--data-path", "direct",
                        "--parent", first], env=env, workdir=workdir)
        a, b = _device_bytes(first), _device_bytes(second)

        def ratio(x: float, y: float) -> Any:
            return round(x / y, 4) if y else None

        return {
            "device_bytes": device_bytes, "changed_fraction": CHANGED,
            "full": {"seconds": full.seconds, "phases_s": _phases_s(full.data), "backup_s": _backup_s(full.data),
                     "device_on_disk": a},
            "incremental": {"seconds": incr.seconds, "phases_s": _phases_s(incr.data),
                            "backup_s": _backup_s(incr.data), "device_on_disk": b,
                            "referenced": int(incr.data.get("device", {}).get("referenced", 0))},
            "bytes_ratio": ratio(b, a),
            "time_ratio": ratio(incr.seconds, full.seconds),
            "phases_time_ratio": ratio(_phases_s(incr.data), _phases_s(full.data)),
            "backup_time_ratio": ratio(_backup_s(incr.data), _backup_s(full.data)),
        }
    finally:
        res.kill(w.pid)
        for d in (first, second):
            shutil.rmtree(d, ignore_errors=True)
