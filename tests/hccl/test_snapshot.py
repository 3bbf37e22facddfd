"""HCCL ranks checkpointed and restored as one set with real CRIU, without the application doing
anything: the ranks are locked at once at a random instant (the free pass lets a rank that is
behind run on to its peers' collective), backed up, dumped and killed; the daemon restarts (new
HCCL port), the ranks are restored and re-form their communicator through one rendezvous
directory, and every rank's weights and losses are bit-identical to an uninterrupted run. A set
that leaves a rank out is refused (exit 11) unless --force; a rank whose peer is stopped before
the collective ends in the lock timeout, every rank running on."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu
from tests.pipeline.support import under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS = 60  # training steps per run (a few ms each, plus the sleep)
TRAIN_ENV = {"HCCL_TRAIN_STEPS": str(STEPS), "HCCL_TRAIN_SLEEP_US": "15000", "HCCL_EXEC_TIMEOUT": "60",
             "HCCL_CONNECT_TIMEOUT": "30"}


def start_training(ranks, daemon, n: int, info: str, agent: bool = True,
                   env: "dict[str, str] | None" = None) -> list[Workload]:
    return [ranks.start("train", r, n, daemon, info, env={**TRAIN_ENV, **(env or {})},
                        prefix=under_agent([]) if agent else ()) for r in range(n)]


def results(lines: list[str]) -> list[str]:
    """What must be bit-identical: every step's loss and the final weights' hash."""
    return [x for x in lines if x.startswith(("step ", "final "))]


def cli_env(daemon, ranks) -> dict[str, str]:
    return {**daemon.env, "LD_LIBRARY_PATH": ranks.ld_path}


def on_all(items: list, *args: object, env: dict[str, str]) -> list:
    """The same npusnap command for every rank at once, ITEM replaced by the rank's pid or
    directory (a rank's lock, or its restore, waits for its peers')."""
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(lambda it: npusnap(*[it if a == "ITEM" else a for a in args], env=env, timeout=90),
                             items))


def assert_ok(done, what: str) -> None:
    for r in done:
        assert r.returncode == 0, (what, r.returncode, r.stderr)


def uninterrupted(n: int, daemons, ranks, short_dir: Path) -> list[list[str]]:
    (daemon,) = daemons(1)
    start_training(ranks, daemon, n, str(short_dir / f"ref{n}.info"), agent=False)
    out = [results(lines) for lines in ranks.wait_all()]
    ranks.stop()
    ranks.ranks.clear()
    assert all(o == out[0] for o in out) and len(out[0]) == STEPS + 1, out[0][-3:]
    return out


# The runbook's phase commands (as a job coordinator drives a node), or one `npusnap restore` per
# rank with the same --rendezvous (as ranks on different hosts are restored).
# Or `npusnap checkpoint PID PID -D DIR` and `npusnap restore DIR`: the set, whole.
@pytest.mark.parametrize("n, trials, flow", [(2, 2, "runbook"), (3, 2, "restore"), (2, 2, "set")])
def test_ranks_checkpointed_as_a_set_restore_bit_identical(n: int, trials: int, flow: str, daemons, ranks,
                                                           short_dir: Path) -> None:
    want = uninterrupted(n, daemons, ranks, short_dir)
    (daemon,) = daemons(1)
    env = cli_env(daemon, ranks)
    rng = random.Random(1600 + n)
    for trial in range(trials):
        gate = StepGate(short_dir / f"gate{trial}", STEPS - 2)  # opened for the restore
        workers = start_training(ranks, daemon, n, str(short_dir / f"t{trial}.info"), env=gate.env)
        pids = [w.pid for w in workers]
        for w in workers:
            w.wait_for_line("step 2", timeout=60)
        delay = rng.uniform(0, 0.25)  # anywhere in a step: in the kernels, the AllReduce or the sleep
        time.sleep(delay)
        if flow == "set":
            ck = short_dir / f"set{trial}"
            r = npusnap("checkpoint", *pids, "-D", ck, env=env, timeout=120)
            assert r.returncode == 0, r.stderr
            for w in workers:
                w.wait_exit(timeout=30)
            daemon.stop()
            daemon.start()
            gate.open()
            r = npusnap("restore", ck, "--detach", env=env, timeout=120)
            assert r.returncode == 0, r.stderr
            finish_and_compare(workers, want, trial, delay)
            continue
        assert_ok(on_all(pids, "lock", "ITEM", "--timeout", "30", env=env), f"lock (trial {trial})")
        infos = [json.loads(npusnap("status", pid, "--json", env=env).stdout) for pid in pids]
        seqs = {d["device"]["communicators"][0]["seq"] for d in infos}
        assert len(seqs) == 1, ("every rank locked after the same collective", infos)
        assert_ok(on_all(pids, "backup", "ITEM", env=env), "backup")
        dirs = [short_dir / f"ck{trial}-{r}" for r in range(n)]
        for pid, d in zip(pids, dirs):
            r = npusnap("dump", pid, "-D", d, env=env, timeout=120)
            assert r.returncode == 0, r.stderr
        for w in workers:
            w.wait_exit(timeout=30)
        daemon.stop()  # a new daemon: new sessions, a new HCCL listener (port)
        daemon.start()
        gate.open()
        meet = Path(tempfile.mkdtemp(prefix="hccl-meet-"))  # private (0700), fresh for this restore
        try:
            if flow == "runbook":
                for d in dirs:
                    r = npusnap("restore", d, "--criu-only", "--detach", env=env, timeout=120)
                    assert r.returncode == 0, r.stderr
                assert_ok(on_all(pids, "device-restore", "ITEM", "--rendezvous", meet, env=env), "device-restore")
                assert_ok(on_all(pids, "unlock", "ITEM", env=env), "unlock")
            else:
                assert_ok(on_all(dirs, "restore", "ITEM", "--detach", "--rendezvous", meet, env=env), "restore")
            assert sorted(p.name for p in meet.iterdir()) == [f"hccl-{comm_id(infos)}.root"]
        finally:
            shutil.rmtree(meet)
        finish_and_compare(workers, want, trial, delay)


def finish_and_compare(workers: list[Workload], want: list[list[str]], trial: int, delay: float) -> None:
    for w in workers:
        w.wait_for_line("done", timeout=60)
        w.wait_exit(timeout=30)
    got = [results(w.lines()) for w in workers]
    assert got == want, f"trial {trial} (delay {delay:.3f}s) differs from the uninterrupted run"
    for w in workers:
        state = json.loads(next(x for x in w.lines() if x.startswith("info "))[5:])
        assert state["seq"] == STEPS and state["daemon_completed"] == STEPS and not state["broken"], state
    for w in workers:
        w.stop()


def comm_id(infos: list[dict]) -> str:
    return str(infos[0]["device"]["communicators"][0]["id"])


def test_a_rank_without_its_peers_is_refused_and_runs_on(daemons, ranks, short_dir: Path) -> None:
    (daemon,) = daemons(1)
    gate = StepGate(short_dir / "gate", STEPS - 2)
    workers = start_training(ranks, daemon, 2, str(short_dir / "root.info"), env=gate.env)
    for w in workers:
        w.wait_for_line("step 1", timeout=60)
    ck = short_dir / "ck"
    r = npusnap("checkpoint", workers[0].pid, "-D", ck, env=cli_env(daemon, ranks))
    gate.open()
    assert r.returncode == 11, (r.returncode, r.stderr)  # PeersOutsideSet (WrongState)
    (line,) = r.stderr.strip().splitlines()
    assert "HCCL communicator" in line and "rank 0 of 2" in line and "rank(s) 1 are not being checkpointed" in line
    assert "--force" in line and "Traceback" not in r.stderr and not ck.exists()
    outputs = ranks.wait_all()  # both run on to the end, unlocked
    assert results(outputs[0]) == results(outputs[1]) and outputs[0][-1] == "done"


def test_force_checkpoints_a_rank_alone_and_its_peer_fails(daemons, ranks, short_dir: Path) -> None:
    (daemon,) = daemons(1)
    gate = StepGate(short_dir / "gate", STEPS - 2)
    workers = start_training(ranks, daemon, 2, str(short_dir / "root.info"), env={"HCCL_EXEC_TIMEOUT": "3", **gate.env})
    for w in workers:
        w.wait_for_line("step 1", timeout=60)
    ck = short_dir / "ck"
    r = npusnap("checkpoint", workers[0].pid, "-D", ck, "--force", env=cli_env(daemon, ranks))
    gate.open()  # the peer's next AllReduce waits for rank 0 in vain
    assert r.returncode == 0, r.stderr
    assert "--force" in r.stderr and "will hang or fail" in r.stderr, r.stderr
    assert (ck / "manifest.yaml").is_file()
    workers[0].wait_exit(timeout=30)  # checkpointed and stopped
    rc = workers[1].proc.wait(timeout=60)  # its AllReduce waits for rank 0 until HCCL_EXEC_TIMEOUT
    assert rc != 0 and "failed" in workers[1].lines()[-1], workers[1].lines()[-3:]


def test_lock_times_out_when_a_peer_is_stopped_before_the_collective(daemons, ranks, short_dir: Path) -> None:
    (daemon,) = daemons(1)
    env = cli_env(daemon, ranks)
    workers = start_training(ranks, daemon, 2, str(short_dir / "root.info"))
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    os.kill(workers[1].pid, signal.SIGSTOP)
    try:
        r = npusnap("lock", workers[0].pid, "--timeout", "2", env=env)
        assert r.returncode == 10, (r.returncode, r.stderr)  # LockTimeout
        (line,) = r.stderr.strip().splitlines()
        assert "507905" in line and "not every rank is being locked" in line, line
        status = json.loads(npusnap("status", workers[0].pid, "--json", env=env).stdout)
        assert status["state"] == "RUNNING", status
    finally:
        os.kill(workers[1].pid, signal.SIGCONT)
    outputs = ranks.wait_all()  # both run on, unharmed
    assert results(outputs[0]) == results(outputs[1]) and len(results(outputs[0])) == STEPS + 1
    assert all(pid_alive(w.pid) is False for w in workers)


def test_force_leave_running_brings_the_rank_back_with_its_communicator_failing(daemons, ranks,
                                                                                short_dir: Path) -> None:
    """A rank checkpointed alone cannot re-form its communicator without its peers; running on
    (or a rollback) must still bring it back: it runs, and its next collective fails clearly."""
    (daemon,) = daemons(1)
    gate = StepGate(short_dir / "gate", STEPS - 2)
    workers = start_training(ranks, daemon, 2, str(short_dir / "root.info"), env={"HCCL_EXEC_TIMEOUT": "3", **gate.env})
    for w in workers:
        w.wait_for_line("step 1", timeout=60)
    r = npusnap("checkpoint", workers[0].pid, "-D", short_dir / "ck", "--force", "--leave-running",
                env=cli_env(daemon, ranks))
    gate.open()
    assert r.returncode == 0, r.stderr
    for w in workers:
        rc = w.proc.wait(timeout=60)
        assert rc != 0 and "failed" in w.lines()[-1], w.lines()[-3:]  # an HCCL error, not a hang
    assert "HcclAllReduce" in workers[0].lines()[-1], workers[0].lines()[-3:]
