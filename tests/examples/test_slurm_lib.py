"""examples/slurm/npusnap-slurm.sh driven without Slurm: fake SLURM_* variables, a fake
`scontrol` on PATH that records its arguments, and the real npusnap, CRIU and npusim.

This runs everywhere CRIU does; test_slurm_real.py runs the same script under a real
one-node Slurm when one can be started."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import Workload, npusnap, pid_alive, requires_criu

from .support import (
    SLURM_LIB,
    new_marker,
    npusnap_bin,
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

FAKE_SCONTROL = """#!/bin/sh
printf '%s\\n' "$*" >>"$FAKE_SCONTROL_LOG"
exit "${FAKE_SCONTROL_RC:-0}"
"""


@pytest.fixture
def marker() -> Iterator[str]:
    m = new_marker()
    try:
        yield m
    finally:
        reap_marked(m)


class Job:
    """One run of the batch logic (`. npusnap-slurm.sh; nps_main CMD`) as Slurm would start it."""

    def __init__(self, tmp: Path, daemon: NpuSimDaemon, marker: str, job_id: str) -> None:
        self.tmp, self.job_id = tmp, job_id
        fake_bin = tmp / "bin"
        fake_bin.mkdir(exist_ok=True)
        (fake_bin / "scontrol").write_text(FAKE_SCONTROL)
        (fake_bin / "scontrol").chmod(0o755)
        self.scontrol_log = tmp / "scontrol.args"
        self.ckpt_root = tmp / "ckpt"
        self.env = script_env(daemon.env, marker, CKPT_DIR=str(self.ckpt_root), SLURM_JOB_ID=job_id,
                              FAKE_SCONTROL_LOG=str(self.scontrol_log))
        self.env["PATH"] = f"{fake_bin}{os.pathsep}{self.env['PATH']}"
        self.runs = 0

    @property
    def checkpoint(self) -> Path:
        return self.ckpt_root / self.job_id

    @property
    def log(self) -> Path:
        return self.ckpt_root / f"{self.job_id}.log"

    def start(self, restart: int, *cmd: str, **extra: str) -> subprocess.Popen:
        self.runs += 1
        self.out = self.tmp / f"batch-{self.runs}.out"
        env = {**self.env, "SLURM_RESTART_COUNT": str(restart), **extra}
        with open(self.out, "wb") as f:
            return subprocess.Popen(["bash", "-c", f'. "{SLURM_LIB}" && nps_main "$@"', "npusnap-job", *cmd],
                                    stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=self.tmp, start_new_session=True)

    def finish(self, proc: subprocess.Popen, timeout: float = 60) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the batch logic did not finish: {self.batch_output()[-1500:]}") from None

    def batch_output(self) -> str:
        return self.out.read_text(errors="replace")

    def scontrol_calls(self) -> list[str]:
        return read_lines(self.scontrol_log)


def train(steps: int, sleep_ms: int) -> list[str]:
    return ["python", *train_args(steps, sleep_ms)]


def test_signal_checkpoints_and_requeues_then_restart_restores(
        tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    steps = 30
    reference = reference_lines(npusim_daemon.env, steps)
    job = Job(tmp_path, npusim_daemon, marker, "4242")

    # First run: USR1 (what --signal=B:USR1@120 sends) -> checkpoint committed -> requeue.
    batch = job.start(0, *train(steps, 100))
    wait_for_line(job.log, "step 3 ", timeout=30, alive=batch)
    pid = workload_pid(job.log)
    assert pid is not None and pid != batch.pid        # the workload, not the batch shell
    batch.send_signal(signal.SIGUSR1)
    assert job.finish(batch) == 0, job.batch_output()
    out = job.batch_output()
    assert "checkpoint committed" in out, out
    assert job.scontrol_calls() == ["requeue 4242"]
    assert not pid_alive(pid), "the workload must be stopped once its checkpoint is committed"
    assert npusnap("verify", job.checkpoint).returncode == 0
    assert "done device-digest" not in job.log.read_text()

    # Restart (SLURM_RESTART_COUNT=1): restored, not started again; same output as uninterrupted.
    batch = job.start(1, *train(steps, 100))
    assert job.finish(batch) == 0, job.batch_output()
    assert f"restored pid {pid} " in job.batch_output(), job.batch_output()
    assert strip_pid(read_lines(job.log)) == reference
    assert job.scontrol_calls() == ["requeue 4242"]      # no second requeue

    # A damaged checkpoint is never restored: it is kept aside, and the job starts fresh.
    image = max((p for p in (job.checkpoint / "criu").iterdir()), key=lambda p: p.stat().st_size)
    with open(image, "r+b") as f:
        f.seek(image.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    batch = job.start(2, *train(steps, 0))
    assert job.finish(batch) == 0, job.batch_output()
    out = job.batch_output()
    assert "does not verify" in out and "started pid" in out and "restored pid" not in out, out
    assert not job.checkpoint.exists()
    aside = [p for p in job.ckpt_root.iterdir() if p.name.startswith("4242.invalid-")]
    assert len(aside) == 1 and (aside[0] / "manifest.yaml").exists()
    assert strip_pid(read_lines(job.log)) == reference          # the fresh run's own output
    assert (job.ckpt_root / "4242.log.prev").exists()           # the restored run's, kept


def test_first_run_and_no_checkpoint_start_fresh(tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    reference = reference_lines(npusim_daemon.env, 5)
    job = Job(tmp_path, npusim_daemon, marker, "4243")
    batch = job.start(3, *train(5, 0))      # a restart, but nothing was ever checkpointed
    assert job.finish(batch) == 0, job.batch_output()
    assert "no checkpoint at" in job.batch_output()
    assert strip_pid(read_lines(job.log)) == reference
    assert job.scontrol_calls() == []

    # The workload's exit code is the job's.
    batch = job.start(0, "python", "-c", "import sys; sys.exit(3)")
    assert job.finish(batch) == 3, job.batch_output()


def test_unrestorable_checkpoint_fails_or_starts_fresh_but_is_kept(
        tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    """A valid checkpoint that cannot be restored here (its pid is taken: the original
    still runs) is never deleted: policy `fail` leaves it in place, `fresh` keeps it aside."""
    job = Job(tmp_path, npusim_daemon, marker, "4244")
    job.ckpt_root.mkdir(mode=0o700)
    original = Workload([npusnap_bin(), "run", "--", *train(400, 50)], tmp_path / "original.out",
                        env=script_env(npusim_daemon.env, marker))
    try:
        original.wait_for_line("step 1 ")
        r = npusnap("checkpoint", original.pid, "-D", job.checkpoint, "--leave-running")
        assert r.returncode == 0, r.stderr

        batch = job.start(1, *train(5, 0), NPUSNAP_ON_RESTORE_FAILURE="fail")
        assert job.finish(batch) == 7, job.batch_output()     # CRIU: the pid is in use
        assert "restore from" in job.batch_output()
        assert npusnap("verify", job.checkpoint).returncode == 0
        assert pid_alive(original.pid)

        batch = job.start(1, *train(5, 0))
        assert job.finish(batch) == 0, job.batch_output()
        aside = [p for p in job.ckpt_root.iterdir() if p.name.startswith("4244.unrestorable-")]
        assert len(aside) == 1 and npusnap("verify", aside[0]).returncode == 0
        assert strip_pid(read_lines(job.log)) == reference_lines(npusim_daemon.env, 5)
    finally:
        original.stop()


def test_requeue_failure_keeps_the_checkpoint_and_says_how_to_resume(
        tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    job = Job(tmp_path, npusim_daemon, marker, "4245")
    batch = job.start(0, *train(400, 50), FAKE_SCONTROL_RC="1")
    wait_for_line(job.log, "step 1 ", timeout=30, alive=batch)
    batch.send_signal(signal.SIGUSR1)
    assert job.finish(batch) == 1, job.batch_output()
    assert "NPUSNAP_JOB_KEY=4245,NPUSNAP_RESUME=1" in job.batch_output()
    assert npusnap("verify", job.checkpoint).returncode == 0

    # ... and that resubmission (a new job id, restart count 0) restores it.
    job2 = Job(tmp_path, npusim_daemon, marker, "4300")
    batch = job2.start(0, *train(400, 50), NPUSNAP_JOB_KEY="4245", NPUSNAP_RESUME="1")
    try:
        wait_for_line(job2.out, "restored pid", timeout=30, alive=batch)
    finally:
        batch.kill()        # the restored workload (and its npusnap restore) go with the marker
        batch.wait()
