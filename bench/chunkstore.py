"""Host pages in the chunk store: bytes and time against a plain checkpoint, in one run.

    python -m bench.chunkstore [--mib 192] [--out FILE.json]

A training-like process (tests/workloads/trainstate.py: weights + Adam moments, bf16-precision
float32) is checkpointed with --leave-running, each way into a fresh parent directory (its own
store):
  plain       no store (the reference)
  none|zstd|lz4|auto   --compress X (none: --dedup alone)
  second      --dedup again after 10% of the process's memory changed (the first's store)
Bytes are what reached the checkpoint directory and the store; time is the CLI's wall time
(median of --repeat). Figures, not pass/fail: nothing here asserts a time."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "trainstate.py"
NPUSNAP = [shutil.which("npusnap", path=os.path.dirname(sys.executable)) or "npusnap"]


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _wait_line(out: Path, prefix: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.startswith(prefix) for line in out.read_text().splitlines()):
            return
        time.sleep(0.02)
    raise SystemExit(f"the workload never printed {prefix!r}")


def _checkpoint(pid: int, parent: Path, name: str, *flags: str) -> tuple[float, int, dict[str, Any]]:
    parent.mkdir(exist_ok=True)
    t = time.perf_counter()
    subprocess.run([*NPUSNAP, "checkpoint", str(pid), "-D", str(parent / name), "--leave-running", *flags],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=600)
    seconds = time.perf_counter() - t
    doc = json.loads(subprocess.run([*NPUSNAP, "inspect", str(parent / name), "--json"], check=True,
                                    capture_output=True, text=True, timeout=120).stdout)
    store = parent / ".npusnap-store" / "packs"
    return seconds, _tree_bytes(parent / name / "criu"), {**(doc.get("host_pages") or {}),
                                                         "store_bytes": _tree_bytes(store) if store.exists() else 0}


def run(mib: int, repeat: int, work: Path) -> dict[str, Any]:
    out = work / "workload.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, str(WORKLOAD), str(mib)], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_line(out, "ready")
        rows: dict[str, Any] = {}
        for way, flags in [("plain", ()), ("none", ("--dedup",)), ("zstd", ("--compress", "zstd")),
                           ("lz4", ("--compress", "lz4")), ("auto", ("--compress", "auto"))]:
            samples = []
            for i in range(repeat):  # a fresh parent each time: an empty store, nothing to dedup against
                samples.append(_checkpoint(proc.pid, work / f"{way}-{i}", "ck", *flags))
            seconds = median(s[0] for s in samples)
            _, criu_bytes, pages = samples[-1]
            written = criu_bytes + pages.get("store_bytes", 0)
            rows[way] = {"seconds": seconds, "bytes": written, "codec": pages.get("codec", "-")}
        first = rows["none"]
        # The second checkpoint into none-0's store, after 10% of the memory changed (1% per step).
        raw = _checkpoint(proc.pid, work / "none-0", "probe", "--dedup")[2]["raw_bytes"]
        shutil.rmtree(work / "none-0" / "probe")
        steps = math.ceil(0.10 * raw / (0.01 * (mib << 20)))
        for i in range(steps):
            os.kill(proc.pid, signal.SIGUSR1)
            _wait_line(out, f"stepped {i + 1}")
        before = _tree_bytes(work / "none-0" / ".npusnap-store" / "packs")
        seconds, criu_bytes, pages = _checkpoint(proc.pid, work / "none-0", "second", "--dedup")
        rows["second"] = {"seconds": seconds, "bytes": criu_bytes + pages["store_bytes"] - before, "codec": "raw"}
        plain = rows["plain"]
        for row in rows.values():
            row["bytes_ratio"] = round(row["bytes"] / plain["bytes"], 3)
            row["time_ratio"] = round(row["seconds"] / plain["seconds"], 3)
        rows["second"]["bytes_vs_first"] = round(rows["second"]["bytes"] / first["bytes"], 3)
        rows["second"]["time_vs_first"] = round(rows["second"]["seconds"] / first["seconds"], 3)
        return {"state_mib": mib, "repeat": repeat, "changed": "10% of host memory", "rows": rows}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def main() -> None:
    from .util import rows_main

    rows_main(__doc__ or "", "npusnap-bench-chunks-", 192, run,
              lambda r: f"{r['bytes'] / 2**20:8.1f} MiB ({r['bytes_ratio']:.2f}x plain), "
                        f"{r['seconds']:.2f} s ({r['time_ratio']:.2f}x plain), codec {r['codec']}")


if __name__ == "__main__":
    main()
