"""examples/periodic/: the checkpoint script against a real workload (incremental, then full, with
--keep 1: one valid checkpoint remains, the job runs on), its guards, and the systemd units."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import Workload, npusnap, requires_criu

from .support import EXAMPLES, PERIODIC, new_marker, npusnap_bin, reap_marked, script_env, train_args

PERIODIC_DIR = EXAMPLES / "periodic"


def periodic(env: dict[str, str], *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(PERIODIC), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@requires_criu
@pytest.mark.criu
def test_incremental_then_full_with_keep_1_and_the_job_running(
        tmp_path: Path, npusim_daemon: NpuSimDaemon) -> None:
    """The second run is incremental against the first (prune keeps its parent); with
    FULL_EVERY=1 the third is full and prune --keep 1 leaves it alone."""
    marker = new_marker()
    env = script_env(npusim_daemon.env, marker)
    job = Workload([npusnap_bin(), "run", "--", "python", *train_args(1000, 50)], tmp_path / "train.out", env=env)
    try:
        job.wait_for_line("step 1 ")
        pidfile = tmp_path / "train.pid"
        pidfile.write_text(f"{job.pid}\n")
        root = tmp_path / "ckpt"
        made = []
        for full_every in ("10", "10", "1"):
            r = periodic({**env, "FULL_EVERY": full_every}, "--name", "train", "--pidfile", pidfile,
                         "--dir", root, "--keep", 1)
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)                   # stdout: the checkpoint's JSON, nothing else
            assert doc["kind"] == "checkpoint" and doc["left_running"] is True and doc["pid"] == job.pid
            made.append(Path(doc["directory"]))
            if len(made) == 2:
                assert doc["parent"] == str(made[0]) and doc["device"]["referenced"] > 0, doc
                assert sorted((root / "train").iterdir()) == made  # the parent is kept for its child
                assert npusnap("verify", made[1]).returncode == 0
        assert doc["parent"] is None                     # FULL_EVERY=1: a full one
        left = sorted(p for p in (root / "train").iterdir())
        assert left == [made[2]], left                  # the chain went; no partials, no leftovers
        assert npusnap("verify", made[2]).returncode == 0
        assert oct(made[2].stat().st_mode & 0o777) == "0o700"
        n = len(job.lines())
        job.wait_for_line(n + 2)                         # still training
        assert npusnap("status", job.pid).returncode == 0
    finally:
        job.stop()
        reap_marked(marker)


def test_guards(tmp_path: Path) -> None:
    env = {**os.environ, "NPUSNAP": "false"}   # never reached
    assert periodic(env, "--keep", 1).returncode == 2                          # no --name
    assert periodic(env, "--name", "x", "--pid", 1, "--keep", 0).returncode == 2
    assert periodic(env, "--name", "../x", "--pid", 1).returncode == 2
    r = periodic(env, "--name", "x", "--pidfile", tmp_path / "none.pid", "--dir", tmp_path)
    assert r.returncode == 4 and "is the job running" in r.stderr
    # A run still going for the same job: this one does nothing (exit 75).
    (tmp_path / "x").mkdir()
    fd = os.open(tmp_path / "x", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = periodic(env, "--name", "x", "--pid", os.getpid(), "--dir", tmp_path)
        assert r.returncode == 75 and "still running" in r.stderr, r.stderr
    finally:
        os.close(fd)


def test_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (package systemd)")
    script = tmp_path / "npusnap-periodic.sh"
    shutil.copy(PERIODIC, script)
    for unit in ("service", "timer"):
        text = (PERIODIC_DIR / f"npusnap-checkpoint@.{unit}").read_text()
        text = text.replace("/usr/local/lib/npusnap/npusnap-periodic.sh", str(script))
        (tmp_path / f"npusnap-checkpoint@train.{unit}").write_text(text)
    r = subprocess.run([analyze, "verify", "--man=no", "npusnap-checkpoint@train.service",
                        "npusnap-checkpoint@train.timer"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if "npusnap-checkpoint@" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_cron_line() -> None:
    lines = [ln for ln in (PERIODIC_DIR / "npusnap-checkpoint.cron").read_text().splitlines()
             if ln.strip() and not ln.startswith("#") and "=" not in ln.split()[0]]
    assert len(lines) == 1
    fields = lines[0].split()
    assert len(fields) > 7 and fields[5] == "root"           # 5 time fields, the user (/etc/cron.d format)
    assert fields[7].endswith("npusnap-periodic.sh") or "npusnap-periodic.sh" in lines[0]
    assert "--keep" in fields and "--name" in fields
