"""Live checkpoints: the workload's downtime (`checkpoint --live`: from the lock to the workload
running on, as npusnap reports it) against the whole of an ordinary --leave-running checkpoint of
the same workload (the command's time: the workload is stopped for all of it), alternately in one
run, median of the samples. The issue's figure: downtime at most 0.25x the full checkpoint time."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

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
    finally:
        res.kill(w.pid)
    f, d = median(full), median(down)
    return {
        "device_bytes": device_bytes, "host_bytes": host_bytes, "samples": len(down),
        "full_s": round(f, 4), "live_downtime_s": round(d, 4), "live_total_s": round(median(live_total), 4),
        "downtime_ratio": round(d / f, 4) if f else None,
    }
