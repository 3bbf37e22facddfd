"""Latencies a person or a scheduler feels: the agent's round trip (one ping, one
connection) and `npusnap --help` (start-up of the CLI)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from .util import Resources, child_env, median, npusnap_exe, percentile, start_workload, workload_argv


def agent_round_trip(res: Resources, workdir: Path, count: int) -> dict[str, Any]:
    from npusnap_cli.platform.agent import AgentClient

    argv = [*npusnap_exe(), "run", "--", *workload_argv(1 << 20, cpu_only=True)]
    w = start_workload(res, argv, workdir / "ping.out", env=child_env())
    try:
        client = AgentClient(w.pid)
        deadline = time.monotonic() + 10
        while True:  # the preloaded agent may still be starting its listener
            try:
                client.ping()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        for _ in range(min(50, count)):
            client.ping()
        samples = []
        for _ in range(count):
            t = time.perf_counter_ns()
            client.ping()
            samples.append((time.perf_counter_ns() - t) / 1e6)
    finally:
        res.kill(w.pid)
    return {"count": count, "median_ms": median(samples), "p99_ms": percentile(samples, 99),
            "min_ms": min(samples), "max_ms": max(samples)}


def help_latency(count: int) -> dict[str, Any]:
    argv = [*npusnap_exe(), "--help"]
    env = child_env()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)  # warm
    samples = []
    for _ in range(count):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        samples.append((time.perf_counter() - t) * 1000)
    return {"count": count, "median_ms": median(samples), "p90_ms": percentile(samples, 90),
            "min_ms": min(samples), "samples_ms": samples}
