"""Incremental checkpoints: a workload with D bytes of random npusim device memory and H bytes of
random host memory is checkpointed (--leave-running, full; --dedup when H is given, so its host
pages start a chunk store), then rewrites a tenth of each and is checkpointed again with --parent
(and --dedup into the same store); with --dedup, the changed state once more, whole and without
the store (plain_s: what the store's first checkpoint costs over that). Reported: both
checkpoints' bytes written (device images, CRIU's files and the store's growth) and times, and
the ratios second/first (the issue's figures: at most 0.15 of the bytes, 0.3 of the time): for
the whole command, for the checkpoint's phases, and for the backup (the device export) alone.

    python -m bench.incremental [--device 3584M] [--host 512M]   # this measurement alone (make bench-incremental)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .util import BenchError, Resources, child_env, npusnap, npusnap_exe, start_workload, unfit

CHANGED = 0.1

WORKLOAD = r"""
import json, os, sys, time
import numpy as np
import npusim

size, host_size, gate, changed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
n, h = int(size * changed), int(host_size * changed)
host = np.random.default_rng(3).integers(0, 256, host_size, dtype=np.uint8)
npusim.init()
npusim.set_device(0)
buf = npusim.malloc(size)
npusim.memcpy_h2d(buf, np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8))
print("ready " + json.dumps({"device_bytes": size, "host_bytes": host_size}), flush=True)
deadline = time.monotonic() + 600
while not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.01)
# In place, as an optimizer step does: the device's tenth by a kernel (y += 0.5 x, from the tenth
# after it), the host's without a temporary array (its pages would be changed host memory too).
npusim.launch_axpy(n // 4, 0.5, buf + size // 3 + n, buf + size // 3)
npusim.synchronize_device()
host[host_size // 3:host_size // 3 + h] ^= np.uint8(0xA5)
print("changed", flush=True)
time.sleep(600)
"""


def _backup_s(data: dict[str, Any]) -> float:
    """The backup phase: the device export, where the incremental one saves its writes."""
    return sum(float(p["seconds"]) for p in data.get("phases", []) if p.get("name") == "backup")


def _each_phase(data: dict[str, Any]) -> dict[str, float]:
    """Each phase's seconds, and each step's inside it (phase/step)."""
    out: dict[str, float] = {}
    for p in data.get("phases", []):
        out[p["name"]] = round(float(p["seconds"]), 4)
        out.update({f"{p['name']}/{k}": round(float(v["seconds"]), 4) for k, v in (p.get("parts") or {}).items()})
    return out


def _phases_s(data: dict[str, Any]) -> float:
    """lock + backup + dump + seal: the checkpoint proper (--leave-running's device restore after
    the commit reads the whole device back either way, and is not among them)."""
    return sum(float(p["seconds"]) for p in data.get("phases", []))


def _device_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in (ckpt / "device").iterdir())


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under path (a missing path: 0)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def fits(workdir: Path, device_bytes: int, host_bytes: int) -> Optional[str]:
    """Why this size cannot run here (the daemon's memory for the device and its snapshot, the
    workload, the images in the page cache; three checkpoints on the disk)."""
    return unfit(3 * device_bytes + 2 * host_bytes + (512 << 20), 3 * (device_bytes + host_bytes), workdir)


def measure(res: Resources, workdir: Path, device_bytes: int, host_bytes: int = 0) -> dict[str, Any]:
    """host_bytes > 0: the workload holds that much random host memory too, a tenth of it changed
    with the device's, and both checkpoints keep their host pages in one chunk store (--dedup)."""
    from npusnap_cli.platform import simdaemon

    sock = str(workdir / "incr.sock")  # sun_path is short
    res.daemons.append(sock)  # stopped with everything else
    simdaemon.start(sock, devices=1, memory=2 * device_bytes + (64 << 20))
    env = child_env({"NPUSIM_SOCKET": sock})
    script = workdir / "incremental_workload.py"
    script.write_text(WORKLOAD)
    gate = workdir / "incremental.go"
    out = workdir / "incremental.out"
    argv = [*npusnap_exe(), "run", "--", sys.executable, str(script), str(device_bytes), str(host_bytes),
            str(gate), str(CHANGED)]
    w = start_workload(res, argv, out, env=env, timeout=300)
    parent = workdir / "incr"  # both checkpoints and their store (--dedup: parent/.npusnap-store)
    parent.mkdir()
    store = parent / ".npusnap-store"
    first, second = parent / "0", parent / "1"
    dedup = ["--dedup"] if host_bytes else []
    try:
        full = npusnap(["checkpoint", w.pid, "-D", first, "--leave-running", "--data-path", "direct", *dedup],
                       env=env, workdir=workdir)
        stored = _tree_bytes(store)
        gate.touch()
        deadline = time.monotonic() + 120
        while "changed" not in out.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise BenchError("the incremental workload did not change its memory in 120 s")
            time.sleep(0.02)
        incr = npusnap(["checkpoint", w.pid, "-D", second, "--leave-running", "--data-path", "direct",
                        "--parent", first, *dedup], env=env, workdir=workdir)
        written_b = _tree_bytes(second) + _tree_bytes(store) - stored
        # The same state checkpointed whole without the store: what --dedup's first costs over it.
        plain = npusnap(["checkpoint", w.pid, "-D", parent / "plain", "--leave-running", "--data-path", "direct"],
                        env=env, workdir=workdir) if dedup else None
        a, b = _device_bytes(first), _device_bytes(second)
        written_a = _tree_bytes(first) + stored

        def ratio(x: float, y: float) -> Any:
            return round(x / y, 4) if y else None

        return {
            "device_bytes": device_bytes, "host_bytes": host_bytes, "changed_fraction": CHANGED,
            "dedup": bool(dedup),
            "full": {"seconds": full.seconds, "phases_s": _phases_s(full.data), "backup_s": _backup_s(full.data),
                     "device_on_disk": a, "written": written_a, "phases": _each_phase(full.data)},
            "incremental": {"seconds": incr.seconds, "phases_s": _phases_s(incr.data),
                            "backup_s": _backup_s(incr.data), "device_on_disk": b, "written": written_b,
                            "phases": _each_phase(incr.data),
                            "referenced": int(incr.data.get("device", {}).get("referenced", 0))},
            "bytes_ratio": ratio(b, a),
            "written_ratio": ratio(written_b, written_a),
            "time_ratio": ratio(incr.seconds, full.seconds),
            "plain_s": plain.seconds if plain else None,
            "time_vs_plain": ratio(incr.seconds, plain.seconds) if plain else None,
            "phases_time_ratio": ratio(_phases_s(incr.data), _phases_s(full.data)),
            "backup_time_ratio": ratio(_backup_s(incr.data), _backup_s(full.data)),
        }
    finally:
        res.kill(w.pid)
        shutil.rmtree(parent, ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> int:
    from .config import parse_sizes
    from .util import measure_alone

    ap = argparse.ArgumentParser(prog="python -m bench.incremental", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="3584M", help="device memory of the workload (default: a 4 GiB job)")
    ap.add_argument("--host", default="512M", help="random host memory of the workload (0: none, no --dedup)")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = ap.parse_args(argv)
    host = 0 if args.host.strip() == "0" else parse_sizes(args.host)[0]
    dev = parse_sizes(args.device)[0]

    def run(res: Resources, dirs: list[Path]) -> dict[str, Any]:
        why = fits(dirs[0], dev, host)
        if why:
            raise BenchError(why)
        return measure(res, dirs[0], dev, host)

    return measure_alone("incremental", [args.dir], run)


if __name__ == "__main__":
    sys.exit(main())
