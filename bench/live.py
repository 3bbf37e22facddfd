"""Live checkpoints: the workload's downtime (`checkpoint --live`: from the lock to the workload
running on, as npusnap reports it) against the whole of an ordinary --leave-running checkpoint of
the same workload (the command's time: the workload is stopped for all of it), alternately in one
run, median of the samples. The issue's figure: downtime at most 0.25x the full checkpoint time.
`stopped` breaks the downtime down by phase (median seconds of each phase and step inside it).

    python -m bench.live [--device 512M] [--host 64M] [--repeat 3]   # this measurement alone
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

from .util import BenchError, Resources, child_env, median, npusnap, npusnap_exe, start_workload, workload_argv


def measure(res: Resources, workdir: Path, tmpfs_dir: Path, host_bytes: int, device_bytes: int,
            repeat: int) -> dict[str, Any]:
    from npusnap_cli.platform import simdaemon

    sock = str(workdir / "live.sock")  # sun_path is short
    res.daemons.append(sock)  # stopped with everything else
    simdaemon.start(sock, devices=1, memory=device_bytes + (64 << 20))
    env = child_env({"NPUSIM_SOCKET": sock})
    argv = [*npusnap_exe(), "run", "--", *workload_argv(host_bytes, device_bytes)]
    w = start_workload(res, argv, workdir / "live.out", env=env)
    full: list[float] = []
    down: list[float] = []
    live_total: list[float] = []
    stopped: dict[str, list[float]] = {}  # the live checkpoints' phases and steps up to the resume
    try:
        for i in range(max(1, repeat)):
            for live in (False, True):
                ck = workdir / f"live-{i}-{int(live)}"
                extra = ["--live", "--live-staging", tmpfs_dir] if live else ["--leave-running"]
                run = npusnap(["checkpoint", w.pid, "-D", ck, "--data-path", "direct", *extra],
                              env=env, workdir=workdir)
                shutil.rmtree(ck, ignore_errors=True)
                if not live:
                    full.append(run.seconds)
                    continue
                if run.data.get("downtime_s") is None:
                    raise BenchError(f"the live checkpoint was not live: {run.stderr.strip()[-300:]}")
                down.append(float(run.data["downtime_s"]))
                live_total.append(run.seconds)
                for name, seconds in _until_resumed(run.data.get("phases", [])):
                    stopped.setdefault(name, []).append(seconds)
    finally:
        res.kill(w.pid)
    f, d = median(full), median(down)
    return {
        "device_bytes": device_bytes, "host_bytes": host_bytes, "samples": len(down),
        "full_s": round(f, 4), "live_downtime_s": round(d, 4), "live_total_s": round(median(live_total), 4),
        "downtime_ratio": round(d / f, 4) if f else None,
        "stopped": {name: round(median(xs), 4) for name, xs in stopped.items()},
    }


def _until_resumed(phases: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """The phases of the stopped window (through resume), each followed by its steps (phase/step)."""
    out: list[tuple[str, float]] = []
    for ph in phases:
        out.append((ph["name"], float(ph["seconds"])))
        out += [(f"{ph['name']}/{step}", float(v["seconds"])) for step, v in (ph.get("parts") or {}).items()]
        if ph["name"] == "resume":
            break
    return out


def main(argv: Optional[list[str]] = None) -> int:
    from .config import parse_sizes
    from .util import measure_alone

    ap = argparse.ArgumentParser(prog="python -m bench.live", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="512M", help="device memory (the full preset's size)")
    ap.add_argument("--host", default="64M", help="host memory of the workload")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"))
    args = ap.parse_args(argv)
    host, dev = parse_sizes(args.host)[0], parse_sizes(args.device)[0]
    return measure_alone("live", [args.dir, args.tmpfs],
                         lambda res, dirs: measure(res, dirs[0], dirs[1], host, dev, args.repeat))


if __name__ == "__main__":
    sys.exit(main())
