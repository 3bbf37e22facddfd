"""examples/slurm/npusnap-job.sbatch under a real one-node Slurm (slurm_cluster.py):
submit, let it train, send USR1 to the batch shell as --signal=B:USR1@120 would, and see
it checkpoint, requeue itself, restore and finish with the output of an uninterrupted run.

Skipped only when Slurm cannot be installed or started here (the reason is the skip
message); test_slurm_lib.py covers the same logic without Slurm."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import ROOT, npusnap, pid_alive, requires_criu

from .slurm_cluster import SlurmCluster, ensure_installed
from .support import (
    SBATCH,
    SLURM_LIB,
    job_checkpoints,
    new_marker,
    read_lines,
    reap_marked,
    reference_lines,
    script_env,
    strip_pid,
    train_args,
    wait_for_line,
    workload_pid,
)

pytestmark = [requires_criu, pytest.mark.criu]


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    reason = ensure_installed()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(new_marker())
    try:
        try:
            cluster.start()
        except (RuntimeError, OSError) as e:
            pytest.skip(f"a one-node Slurm could not be started here: {e}")
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(900)    # includes installing slurm-wlm and munge when missing
def test_sbatch_checkpoint_requeue_restore(tmp_path: Path, npusim_daemon: NpuSimDaemon, slurm: SlurmCluster) -> None:
    steps = 30
    reference = reference_lines(npusim_daemon.env, steps)
    ckpt = tmp_path / "ckpt"
    env = script_env(npusim_daemon.env, slurm.marker, SLURM_CONF=str(slurm.conf), CKPT_DIR=str(ckpt),
                     NPUSNAP_SLURM_LIB=str(SLURM_LIB), NPUSNAP_VENV=sys.prefix)
    try:
        r = slurm.run("sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out", "--time=10",
                      str(SBATCH), "python", *train_args(steps, 100), env=env, cwd=ROOT)
        job_id = r.stdout.strip().split(";")[0]
        out = tmp_path / f"slurm-{job_id}.out"
        log = ckpt / f"{job_id}.log"
        wait_for_line(log, "step 3 ", timeout=30)
        pid = workload_pid(log)
        # What Slurm does 120 s before the time limit (--signal=B:USR1@120): USR1 to the batch shell.
        slurm.run("scancel", "--signal=USR1", "--batch", job_id)

        deadline = time.monotonic() + 60
        job = slurm.job(job_id)
        while time.monotonic() < deadline and job.get("JobState") not in ("COMPLETED", "FAILED", "CANCELLED",
                                                                          "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            time.sleep(0.5)
            job = slurm.job(job_id)
        text = "\n".join(read_lines(out))
        assert job.get("JobState") == "COMPLETED", f"{job.get('JobState')}: {text[-2000:]}"
        assert job.get("Restarts") == "1", text
        assert "checkpoint committed" in text and "requeued" in text, text
        assert f"restored pid {pid} " in text, text
        assert strip_pid(read_lines(log)) == reference
        assert pid is not None and not pid_alive(pid)
        kept = job_checkpoints(ckpt / job_id)                 # the last checkpoint stays (for prune)
        assert len(kept) == 1 and npusnap("verify", kept[0]).returncode == 0
    finally:
        reap_marked(slurm.marker)
