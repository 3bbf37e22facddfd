"""The benchmark suite runs end to end in its smallest configuration and writes a
well-formed results.json. Timing values are never checked here (this machine is shared)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import ROOT, requires_criu

pytestmark = [
    requires_criu,
    pytest.mark.skipif(os.geteuid() != 0, reason="CRIU needs root"),
    pytest.mark.timeout(120),
]


def _numbers(obj: object, where: str = "$") -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if isinstance(obj, bool):
        return out
    if isinstance(obj, (int, float)):
        out.append((where, float(obj)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += _numbers(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _numbers(v, f"{where}[{i}]")
    return out


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="bench-smoke-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _left_behind(root: Path) -> list[str]:
    """Processes working in root or naming it on their command line (a daemon's socket)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmdline = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if Path(os.readlink(p / "cwd")).is_relative_to(root) or str(root) in cmdline:
                found.append(f"{p.name}: {cmdline}")
        except OSError:
            pass
    return found


def test_bench_tiny_writes_well_formed_results(tmp_path: Path, shm_dir: Path) -> None:
    out = tmp_path / "results.json"
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--sizes", "tiny", "--no-plot", "--output", str(out),
         "--dir", str(work), "--tmpfs", str(shm_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())

    assert set(doc) >= {"targets", "limits", "runs", "machine"}
    names = [t["name"] for t in doc["targets"]]
    assert len(names) == len(set(names)) and len(names) >= 8
    for t in doc["targets"]:
        assert {"name", "value", "goal", "met"} <= set(t), t
        assert isinstance(t["name"], str) and t["name"]
        assert isinstance(t["value"], (int, float)) and not isinstance(t["value"], bool), t
        assert isinstance(t["goal"], (int, float)) and not isinstance(t["goal"], bool), t
        assert math.isfinite(t["value"]) and math.isfinite(t["goal"]), t
        assert isinstance(t["met"], bool), t
        assert t["met"] == (t["value"] >= t["goal"] if t["cmp"] == ">=" else t["value"] <= t["goal"]), t

    for key in ("memcpy_Bps", "disk_write_fsync_Bps", "disk_read_cold_Bps", "tmpfs_write_Bps", "tmpfs_read_Bps"):
        assert doc["limits"][key] > 0, key
    kinds = {(r["kind"], r["op"], r["storage"]) for r in doc["runs"]}
    assert {("cpu-only", "checkpoint", "disk"), ("device", "checkpoint", "disk"), ("device", "restore", "disk"),
            ("device", "checkpoint", "tmpfs"), ("device", "restore", "tmpfs")} <= kinds
    for r in doc["runs"]:
        assert r["seconds"] > 0 and r["state_bytes"] > 0, r
        if r["kind"] == "device":  # held to the limit its own samples measured, on a file of the image's size
            assert len(r["limit_samples"]) == len(r["samples"]) and r["limit_Bps"] > 0, r
            assert r["limit_file_bytes"] >= r["host_bytes"], r
            if (r["op"], r["storage"]) == ("restore", "disk"):  # the best of one reader and eight
                assert set(r["limit_by_readers"]) == {"1", "8"}, r
                assert r["limit_Bps"] >= min(r["limit_by_readers"].values()), r
    inc = doc["incremental"]  # a tenth of the device and host memory changed: bytes, never times, are checked
    assert inc["incremental"]["device_on_disk"] <= 0.15 * inc["full"]["device_on_disk"], inc
    assert inc["incremental"]["referenced"] >= 0.85 * inc["device_bytes"], inc
    assert inc["dedup"] and 0 < inc["incremental"]["written"] <= 0.2 * inc["full"]["written"], inc  # host pages too
    assert {t["name"] for t in doc["targets"] if t["name"].startswith("incremental checkpoint")}, doc["targets"]
    live = doc["live"]  # measured in the same run; the ratio is a target, not asserted
    assert live["samples"] >= 1 and live["live_downtime_s"] > 0 and live["full_s"] > 0, live
    assert {"lock", "backup", "dump", "resume"} <= set(live["stopped"]), live  # the stopped time, phase by phase
    bad = [(w, v) for w, v in _numbers(doc) if not math.isfinite(v)]
    assert not bad, bad

    # Everything it started is gone: no files left behind, no process still running there.
    assert list(work.iterdir()) == [] and list(shm_dir.iterdir()) == []
    assert _left_behind(work) == []


def test_the_job_bench_is_skipped_with_the_reason_without_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import job
    from tests.cluster import support

    monkeypatch.setattr(support, "missing", lambda: "needs Slurm and munge (sbatch missing)")
    doc = job.measure(16, 1, progress=lambda _: None)
    assert doc == {"skipped": "needs Slurm and munge (sbatch missing)"}
    assert job.render(doc) == "job: skipped: needs Slurm and munge (sbatch missing)"
