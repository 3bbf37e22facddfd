"""A live set checkpoint of HCCL ranks (`checkpoint PID PID --live`): every rank locked, backed up
(the direct path: the daemon's copy-on-write snapshot) and dumped into memory, then every rank runs
on together, its communicator re-formed through the set's rendezvous directory as after a
--leave-running commit, before the write-behind; the training loop (an AllReduce of the gradients
each step) goes on bit-identical to an uninterrupted run, and the checkpoint, restored on a
restarted daemon, re-forms the communicator and replays the run bit-identical. A failure during the
write-behind, the ranks already running on, costs only the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults.support import one_error_line
from tests.helpers import StepGate, npusnap, requires_criu, rewind_to_checkpoint

from .test_inplace import LONG, assert_all_run_on, assert_bit_identical, no_meeting_left, private_tmp
from .test_snapshot import STEPS, cli_env, finish_and_compare, start_training, uninterrupted

pytestmark = [requires_criu, pytest.mark.criu]


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_a_live_set_of_hccl_ranks_runs_on_with_its_communicators(data_path: str, daemons, ranks, short_dir: Path,
                                                                  shm: Path) -> None:
    (daemon,) = daemons(1)
    tmp, env = private_tmp(short_dir, cli_env(daemon, ranks))
    workers = start_training(ranks, daemon, 2, str(short_dir / "train.info"), env=LONG)
    pids = [w.pid for w in workers]
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    live = ("--live", "--live-staging", shm, "--data-path", data_path, "--json")

    r = npusnap("checkpoint", *pids, "-D", short_dir / "fail", *live, timeout=180,
                env={**env, "NPUSNAP_TEST_FAIL": "during:write-behind"})
    assert r.returncode == 3, r.stderr
    assert "test failure injected at during:write-behind" in one_error_line(r.stderr)
    assert not (short_dir / "fail").exists() and list(shm.iterdir()) == []
    assert_all_run_on(workers, env, "a failed write-behind")

    target = short_dir / "ck"
    r = npusnap("checkpoint", *pids, "-D", target, *live, env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "resume", "write-behind", "seal"]
    assert doc["downtime_s"] > 0 and list(shm.iterdir()) == []
    npusnap("verify", target, check=True)
    assert_all_run_on(workers, env, "--live")
    no_meeting_left(tmp)
    assert_bit_identical(workers, daemon, ranks, short_dir, 2)


def test_a_live_set_of_hccl_ranks_restores_bit_identical(daemons, ranks, short_dir: Path, shm: Path) -> None:
    want = uninterrupted(2, daemons, ranks, short_dir)
    (daemon,) = daemons(1)
    env = cli_env(daemon, ranks)
    gate = StepGate(short_dir / "gate", STEPS - 2)  # opened for the restore
    workers = start_training(ranks, daemon, 2, str(short_dir / "t.info"), env=gate.env)
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    ck = short_dir / "ck"
    r = npusnap("checkpoint", *(w.pid for w in workers), "-D", ck, "--live", "--live-staging", shm,
                "--data-path", "direct", env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    for w in workers:  # trained on past the checkpoint, then gone
        w.wait_for_line("step 8", timeout=60)
    for w in workers:
        w.proc.kill()
        w.proc.wait()
        rewind_to_checkpoint(ck, w.out, member=w.pid)
    daemon.stop()
    daemon.start()
    gate.open()
    r = npusnap("restore", ck, "--detach", env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    finish_and_compare(workers, want, 0, 0.0)
