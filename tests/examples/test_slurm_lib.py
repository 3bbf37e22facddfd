"""examples/slurm/npusnap-slurm.sh driven without Slurm: fake SLURM_* variables, a fake
`scontrol` on PATH that records its arguments, and the real npusnap, CRIU and npusim. A job's
checkpoints form a chain across its requeues: each run's checkpoint is incremental against the one
it restored.

This runs everywhere CRIU does; test_slurm_real.py runs the same script under a real
one-node Slurm when one can be started."""

from __future__ import annotations

import json
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
    job_checkpoints,
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
    def dir(self) -> Path:
        """The job's checkpoints' directory."""
        return self.ckpt_root / self.job_id

    def checkpoints(self) -> list[Path]:
        return job_checkpoints(self.dir)

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


def last_step(log: Path) -> int:
    return max((int(line.split()[1]) for line in read_lines(log) if line.startswith("step ")), default=-1)


def inspect(ck: Path) -> dict:
    r = npusnap("inspect", ck, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_signal_checkpoints_and_requeues_then_restart_restores_through_the_chain(
        tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    steps = 30
    reference = reference_lines(npusim_daemon.env, steps)
    job = Job(tmp_path, npusim_daemon, marker, "4242")
    job.env["NPUSNAP_CHECKPOINT_DEDUP"] = "1"       # npusnap's own setting: host pages into the store

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
    [first] = job.checkpoints()
    assert npusnap("verify", first).returncode == 0
    assert (job.dir / ".npusnap-store").is_dir()
    assert "done device-digest" not in job.log.read_text()

    # Restart (SLURM_RESTART_COUNT=1): restored, trains on; its checkpoint only what changed since.
    batch = job.start(1, *train(steps, 100))
    wait_for_line(job.out, "restored pid", timeout=30, alive=batch)
    wait_for_line(job.log, f"step {last_step(job.log) + 2} ", timeout=30, alive=batch)
    batch.send_signal(signal.SIGUSR1)
    assert job.finish(batch) == 0, job.batch_output()
    out = job.batch_output()
    assert f"restored pid {pid} from {first}" in out and f"incremental: what changed since {first.name}" in out, out
    assert job.scontrol_calls() == ["requeue 4242"] * 2
    assert job.checkpoints()[0] == first and len(job.checkpoints()) == 2   # the parent is kept
    second = job.checkpoints()[1]
    doc = inspect(second)
    assert doc["chain"]["parent"] == str(first) and doc["chain"]["device_referenced"] > 0, doc["chain"]

    # Second restart: restored from the second checkpoint through its chain; the same output as
    # an uninterrupted run.
    batch = job.start(2, *train(steps, 100))
    assert job.finish(batch) == 0, job.batch_output()
    assert f"restored pid {pid} from {second}" in job.batch_output(), job.batch_output()
    assert strip_pid(read_lines(job.log)) == reference
    assert job.scontrol_calls() == ["requeue 4242"] * 2      # no third requeue

    # A damaged link is never restored from: the job's checkpoints are kept aside whole, and the
    # job starts fresh.
    image = max((p for p in (first / "device").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(image, "r+b") as f:
        f.seek(image.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    batch = job.start(3, *train(steps, 0))
    assert job.finish(batch) == 0, job.batch_output()
    out = job.batch_output()
    assert "does not verify" in out and first.name in out, out
    assert "started pid" in out and "restored pid" not in out, out
    assert not job.dir.exists()
    aside = [p for p in job.ckpt_root.iterdir() if p.name.startswith("4242.invalid-")]
    assert len(aside) == 1 and [p.name for p in job_checkpoints(aside[0])] == [first.name, second.name]
    assert strip_pid(read_lines(job.log)) == reference          # the fresh run's own output
    assert (job.ckpt_root / "4242.log.prev").exists()           # the restored run's, kept


def test_first_run_and_no_checkpoint_start_fresh(tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    reference = reference_lines(npusim_daemon.env, 5)
    job = Job(tmp_path, npusim_daemon, marker, "4243")
    batch = job.start(3, *train(5, 0))      # a restart, but nothing was ever checkpointed
    assert job.finish(batch) == 0, job.batch_output()
    assert "no checkpoint in" in job.batch_output()
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
    job.dir.mkdir(mode=0o700, parents=True)
    original = Workload([npusnap_bin(), "run", "--", *train(400, 50)], tmp_path / "original.out",
                        env=script_env(npusim_daemon.env, marker))
    try:
        original.wait_for_line("step 1 ")
        ck = job.dir / "20261206T120000.000000000Z"
        r = npusnap("checkpoint", original.pid, "-D", ck, "--leave-running")
        assert r.returncode == 0, r.stderr

        batch = job.start(1, *train(5, 0), NPUSNAP_ON_RESTORE_FAILURE="fail")
        assert job.finish(batch) == 7, job.batch_output()     # CRIU: the pid is in use
        assert f"restore from {ck} failed" in job.batch_output()
        assert npusnap("verify", ck).returncode == 0
        assert pid_alive(original.pid)

        batch = job.start(1, *train(5, 0))
        assert job.finish(batch) == 0, job.batch_output()
        aside = [p for p in job.ckpt_root.iterdir() if p.name.startswith("4244.unrestorable-")]
        assert len(aside) == 1 and npusnap("verify", aside[0] / ck.name).returncode == 0
        assert not job.dir.exists()
        assert strip_pid(read_lines(job.log)) == reference_lines(npusim_daemon.env, 5)
    finally:
        original.stop()


def test_requeue_failure_keeps_the_checkpoint_and_says_how_to_resume(
        tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    job = Job(tmp_path, npusim_daemon, marker, "4245")
    # In-process device images: a checkpoint that cannot be a parent (below).
    batch = job.start(0, *train(400, 50), FAKE_SCONTROL_RC="1", NPUSNAP_CHECKPOINT_DATA_PATH="in-process")
    wait_for_line(job.log, "step 1 ", timeout=30, alive=batch)
    batch.send_signal(signal.SIGUSR1)
    assert job.finish(batch) == 1, job.batch_output()
    assert "NPUSNAP_JOB_KEY=4245,NPUSNAP_RESUME=1" in job.batch_output()
    [first] = job.checkpoints()
    assert npusnap("verify", first).returncode == 0

    # ... and that resubmission (a new job id, restart count 0) restores it. Its checkpoint, refused
    # the in-process one as its parent (exit 8), is a full one.
    job2 = Job(tmp_path, npusim_daemon, marker, "4300")
    batch = job2.start(0, *train(400, 50), NPUSNAP_JOB_KEY="4245", NPUSNAP_RESUME="1")
    wait_for_line(job2.out, "restored pid", timeout=30, alive=batch)
    batch.send_signal(signal.SIGUSR1)
    assert job2.finish(batch) == 0, job2.batch_output()
    out = job2.batch_output()
    assert f"{first} cannot be the parent (npusnap exit 8" in out and "checkpoint committed" in out, out
    assert job2.scontrol_calls() == ["requeue 4245", "requeue 4300"]   # one log: the first failed
    second = job.checkpoints()[-1]
    assert second != first and inspect(second)["chain"]["parent"] is None
    assert npusnap("verify", second).returncode == 0


def test_a_job_directory_that_is_a_checkpoint_still_restores(
        tmp_path: Path, npusim_daemon: NpuSimDaemon, marker: str) -> None:
    """An earlier version's layout ($CKPT_DIR/$JOB itself the checkpoint): restored; the next
    checkpoint, a full one, goes into it, and the restart after that restores that one."""
    steps = 30
    reference = reference_lines(npusim_daemon.env, steps)
    job = Job(tmp_path, npusim_daemon, marker, "4246")
    job.ckpt_root.mkdir(mode=0o700)
    batch = job.start(0, *train(steps, 100))
    wait_for_line(job.log, "step 3 ", timeout=30, alive=batch)
    pid = workload_pid(job.log)
    r = npusnap("checkpoint", pid, "-D", job.dir)        # what the earlier script did on USR1
    assert r.returncode == 0, r.stderr
    assert job.finish(batch) == 137, job.batch_output()  # its workload, killed after the commit
    batch = job.start(1, *train(steps, 100))
    wait_for_line(job.out, "restored pid", timeout=30, alive=batch)
    wait_for_line(job.log, f"step {last_step(job.log) + 2} ", timeout=30, alive=batch)
    batch.send_signal(signal.SIGUSR1)
    assert job.finish(batch) == 0, job.batch_output()
    assert "incremental" not in job.batch_output(), job.batch_output()
    [inner] = [p for p in job.checkpoints() if (p / "manifest.yaml").is_file()]   # beside criu/, device/
    batch = job.start(2, *train(steps, 100))
    assert job.finish(batch) == 0, job.batch_output()
    assert f"restored pid {pid} from {inner}" in job.batch_output(), job.batch_output()
    assert strip_pid(read_lines(job.log)) == reference
