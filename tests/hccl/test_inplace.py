"""In-place restores of a set of HCCL ranks (issue #16's data-loss gap): every way a set checkpoint
puts its members' devices back without a `npusnap restore` -- the rollback after Backup (an
injected failure between the members' backups or after them, before or after a member's dump, a
commit that fails, SIGINT at random instants), --leave-running after the commit, and the agents'
own restores when the CLI's lease runs out -- brings every rank back running and unlocked, with its
communicator re-formed through the set's rendezvous directory: the training loop (hccl_ranks
train, data-parallel with an AllReduce of the gradients each step) goes on, bit-identical to an
uninterrupted run. No rank is left stopped, locked or orphaned. 2 and 4 ranks; `make faults` runs
more SIGINTs (NPUSNAP_FAULT_HCCL_SIGINT). A daemon slow to notice ranks leave at their backup
(NPUSIM_TEST_HCCL_LEAVE_MS) changes none of it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.faults.support import DOCUMENTED_CODES, PausedCli, one_error_line
from tests.faults.test_random_faults import SEED, _fault
from tests.helpers import agent_status, npusnap, npusnap_cmd, proc_state, requires_criu

from .test_snapshot import cli_env, start_training

pytestmark = [requires_criu, pytest.mark.criu]

LONG = {"HCCL_TRAIN_STEPS": "1000000", "HCCL_TRAIN_SLEEP_US": "20000"}  # ends when the test stops it
SIGINTS = int(os.environ.get("NPUSNAP_FAULT_HCCL_SIGINT") or 4)  # `make faults`: 40
ADVANCE_S = 60  # bound on a rank's next steps after a case (a few ms each; 30 s is HCCL's connect timeout)


def steps(w) -> list[str]:
    return [x for x in w.lines() if x.startswith("step ")]


def assert_all_run_on(workers, env: dict[str, str], what: str, more: int = 3) -> None:
    """Every rank RUNNING (unlocked), not stopped, and training on: `more` new steps each, which
    take AllReduces with every peer (a communicator left broken fails or hangs them)."""
    for w in workers:
        assert proc_state(w.pid) not in ("T", "t", "Z", "gone"), (what, w.pid, proc_state(w.pid))
        state = agent_status(w.pid, env)["state"]
        assert state == "RUNNING", (what, w.pid, state)
    marks = [len(steps(w)) for w in workers]
    for w, mark in zip(workers, marks):
        deadline = time.monotonic() + ADVANCE_S
        while len(steps(w)) < mark + more:
            assert w.proc.poll() is None, (what, w.pid, w.lines()[-5:])
            assert time.monotonic() < deadline, (what, f"rank {w.pid} did not train on", w.lines()[-3:])
            time.sleep(0.05)


def assert_bit_identical(workers, daemon, ranks, short_dir: Path, n: int) -> None:
    """Stop the ranks, then run the same training uninterrupted for as many steps as they printed:
    every rank's every step line is the uninterrupted run's."""
    got = [steps(w) for w in workers]
    ranks.stop()
    ranks.ranks.clear()
    count = min(len(g) for g in got)
    assert count > 0
    ref = start_training(ranks, daemon, n, str(short_dir / "reference.info"), agent=False,
                         env={"HCCL_TRAIN_STEPS": str(count), "HCCL_TRAIN_SLEEP_US": "0"})
    ranks.wait_all()
    want = [steps(w) for w in ref]
    ranks.stop()
    assert all(s == want[0] for s in want)
    for rank, lines in enumerate(got):
        for i, line in enumerate(lines[:count]):
            assert line == want[0][i], f"rank {rank} step line {i}: {line!r} != {want[0][i]!r}"


def checkpoint(pids, target: Path, env: dict[str, str], *extra: object, fail: str = "") -> subprocess.CompletedProcess:
    return npusnap("checkpoint", *pids, "-D", target, *extra, env={**env, **({"NPUSNAP_TEST_FAIL": fail} if fail else {})},
                   timeout=180)


def assert_rolled_back(workers, target: Path, env: dict[str, str], point: str, *extra: object) -> None:
    """A set checkpoint failing at point: rolled back (exit 3), every rank's device back, running on."""
    r = checkpoint([w.pid for w in workers], target, env, *extra, fail=point)
    assert r.returncode == 3, (point, r.returncode, r.stderr)
    assert f"test failure injected at {point}" in one_error_line(r.stderr), r.stderr
    assert "device rollback" not in r.stderr, r.stderr  # every rank's came back
    assert not (target / "manifest.yaml").exists()
    assert_all_run_on(workers, env, point)


def private_tmp(short_dir: Path, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The CLI's TMPDIR, where the set's rendezvous directory is made: ours alone to look into."""
    tmp = short_dir / "tmp"
    tmp.mkdir(0o700)
    return tmp, {**env, "TMPDIR": str(tmp)}


def meetings(tmp: Path) -> list[str]:
    return [p.name for p in tmp.glob("npusnap-hccl-*")]


def no_meeting_left(tmp: Path) -> None:
    """The set's rendezvous directory is removed once the checkpoint is over."""
    assert not meetings(tmp), meetings(tmp)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("data_path", ["in-process", "direct"])
def test_every_in_place_restore_of_a_set_brings_every_rank_back(n: int, data_path: str, daemons, ranks,
                                                                 short_dir: Path) -> None:
    (daemon,) = daemons(1)
    tmp, env = private_tmp(short_dir, cli_env(daemon, ranks))
    workers = start_training(ranks, daemon, n, str(short_dir / "train.info"), env=LONG)
    pids = [w.pid for w in workers]
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    path = ("--data-path", data_path)
    # A failure amid the members' backups (they run at once: the last one's failing before it
    # starts leaves the others backed up and it still locked; the last one's device files written,
    # as a Ctrl-C would leave them), after the last backup, before a member's dump, after every
    # dump: rolled back (exit 3).
    points = [f"before:backup@{pids[-1]}", *([f"after:export@{pids[-1]}"] if data_path == "direct" else []),
              f"after:backup@{pids[-1]}", f"before:dump@{pids[0]}", "after:dump"]
    for i, point in enumerate(points):
        assert_rolled_back(workers, short_dir / f"fail{i}", env, point, *path)
    # A commit that fails: DIR appears while the set is sealed (nothing is ever replaced).
    target = short_dir / "commit"
    cli = PausedCli(["checkpoint", *pids, "-D", target, *path], "after:seal", {**env, "NPUSNAP_TEST_PAUSE_S": "2"})
    try:
        target.write_text("not a checkpoint\n")
        _, err = cli.proc.communicate(timeout=180)
    finally:
        cli.kill()
    err = cli.stderr + err.decode()
    assert cli.proc.returncode == 12, (cli.proc.returncode, err)  # StorageProblem
    assert "changed while the checkpoint was written" in one_error_line(err), err
    assert target.read_text() == "not a checkpoint\n" and "device rollback" not in err, err
    assert_all_run_on(workers, env, "failed commit")
    # --leave-running: committed, and every rank runs on from the committed images.
    target = short_dir / "kept"
    r = checkpoint(pids, target, env, *path, "--leave-running")
    assert r.returncode == 0, r.stderr
    npusnap("verify", target, check=True)
    assert_all_run_on(workers, env, "--leave-running")
    no_meeting_left(tmp)
    assert_bit_identical(workers, daemon, ranks, short_dir, n)


def test_a_daemon_slow_to_see_the_ranks_leave_still_has_them_re_form(daemons, ranks, short_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback right after the backups, on a daemon that notices the ranks' closed connections
    2 s late (as on a loaded host): rank 0's restore waits for the old communicator's ranks to leave
    instead of keeping it (whose secret no restored rank knows), and every rank re-forms it."""
    monkeypatch.setenv("NPUSIM_TEST_HCCL_LEAVE_MS", "2000")  # read by the daemon only
    (daemon,) = daemons(1)
    tmp, env = private_tmp(short_dir, cli_env(daemon, ranks))
    workers = start_training(ranks, daemon, 2, str(short_dir / "train.info"), env=LONG)
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    for i, point in enumerate(["after:backup", f"after:backup@{workers[0].pid}"]):
        assert_rolled_back(workers, short_dir / f"fail{i}", env, point)
    no_meeting_left(tmp)
    assert_bit_identical(workers, daemon, ranks, short_dir, 2)


@pytest.mark.parametrize("n", [2, 4])
def test_leases_that_run_out_bring_every_rank_back(n: int, daemons, ranks, short_dir: Path) -> None:
    """The CLI stopped past its lease after the backup: each rank's agent restores by itself, all
    meeting in the set's directory (which outlives the stop); the CLI then learns it lost (exit 9).
    In-process data path: after a direct backup the data is in files only the CLI or `npusnap
    recover` can put back, so an agent leaves it BACKED_UP (agent.c)."""
    (daemon,) = daemons(1)
    tmp, env = private_tmp(short_dir, cli_env(daemon, ranks))
    workers = start_training(ranks, daemon, n, str(short_dir / "train.info"),
                             env={**LONG, "NPUSNAP_AGENT_LOG": str(short_dir / "agent.log")})
    pids = [w.pid for w in workers]
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    cli = PausedCli(["checkpoint", *pids, "-D", short_dir / "lease", "--lease", "2", "--data-path", "in-process"],
                    "after:backup",
                    {**env, "NPUSNAP_TEST_PAUSE_S": "1"})
    try:
        os.kill(cli.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + ADVANCE_S
        while any(agent_status(p, env)["state"] != "RUNNING" for p in pids):
            assert time.monotonic() < deadline, ("the leases did not bring the ranks back",
                                                 [agent_status(p, env) for p in pids],
                                                 [x for x in (short_dir / "agent.log").read_text().splitlines()
                                                  if " status " not in x and " renew " not in x][-20:])
            time.sleep(0.2)
        assert_all_run_on(workers, env, "lease expiry")
        os.kill(cli.proc.pid, signal.SIGCONT)
        _, err = cli.proc.communicate(timeout=180)
    finally:
        cli.kill()
    err = cli.stderr + err.decode()
    assert cli.proc.returncode == 9, (cli.proc.returncode, err)  # LeaseLost
    assert "lease" in one_error_line(err), err
    assert_all_run_on(workers, env, "after the lease")
    no_meeting_left(tmp)
    assert_bit_identical(workers, daemon, ranks, short_dir, n)


@pytest.mark.parametrize("point", ["after:backup", "after:backup@{first},before:backup@{second}", "after:dump@{first}"])
@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_a_cli_killed_after_the_backup_every_rank_comes_back(point: str, data_path: str, daemons, ranks,
                                                             short_dir: Path) -> None:
    """SIGKILL: the guardian recovers every rank at once through the set's directory (the direct
    path's data from the staged files), then removes the directory. Killed between the members'
    backups (the first rank gone from its communicator, the other still in it), it backs up the
    locked rank first, so that both re-form the communicator; killed after the first member's dump,
    it waits for no CRIU and resumes the stopped rank (the members back up at once: the second is
    held before its own for the first to be alone)."""
    (daemon,) = daemons(1)
    tmp, env = private_tmp(short_dir, cli_env(daemon, ranks))
    workers = start_training(ranks, daemon, 2, str(short_dir / "train.info"), env=LONG)
    pids = [w.pid for w in workers]
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    cli = PausedCli(["checkpoint", *pids, "-D", short_dir / "killed", "--data-path", data_path],
                    point.format(first=pids[0], second=pids[1]), env)
    cli.kill()
    deadline = time.monotonic() + ADVANCE_S
    while any(agent_status(p, env)["state"] != "RUNNING" for p in pids) or meetings(tmp):
        assert time.monotonic() < deadline, ([agent_status(p, env)["state"] for p in pids], meetings(tmp))
        time.sleep(0.2)
    assert_all_run_on(workers, env, "guardian")
    assert not (short_dir / "killed").exists()
    assert_bit_identical(workers, daemon, ranks, short_dir, 2)


@pytest.mark.parametrize("n", [2, 4])
def test_sigint_at_random_instants_of_an_hccl_set_checkpoint(n: int, daemons, ranks, short_dir: Path) -> None:
    """--leave-running, so every outcome (rolled back, or committed and run on) leaves every rank
    running: SIGINT lands anywhere from the lock to the device restores after the commit."""
    (daemon,) = daemons(1)
    tmp, env = private_tmp(short_dir, cli_env(daemon, ranks))
    workers = start_training(ranks, daemon, n, str(short_dir / "train.info"), env=LONG)
    pids = [w.pid for w in workers]
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    rng = random.Random(f"{SEED}:hccl:{n}")
    seconds = 2.0  # adapts towards the checkpoint's real length, so signals land inside it
    outcomes: list[str] = []
    for i in range(SIGINTS // (2 if n == 4 else 1) or 1):
        target = short_dir / f"ck{i}"
        delay = rng.uniform(0.0, seconds)
        what = f"seed {SEED} trial {i}: SIGINT after {delay:.3f} s"
        start = time.monotonic()
        cli = subprocess.Popen([*npusnap_cmd(), "checkpoint", *map(str, pids), "-D", str(target), "--leave-running"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
        try:
            landed, early = _fault(cli, "SIGINT", delay, 0)
            _, err = cli.communicate(timeout=180)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.communicate()
        if not landed:
            seconds = 0.7 * seconds + 0.3 * (time.monotonic() - start)
        rc = cli.returncode
        if rc == -signal.SIGINT and not err and early:
            outcomes.append("interrupted inside execve")
        else:
            assert rc in {0} | DOCUMENTED_CODES and "Traceback" not in err, f"{what}: exit {rc}: {err}"
            assert "device rollback" not in err, f"{what}: {err}"
            if rc != 0:
                one_error_line(err)
                assert not (target / "manifest.yaml").exists(), what
            outcomes.append("finished before the signal" if not landed else f"exit {rc}")
        assert_all_run_on(workers, env, what)
    no_meeting_left(tmp)
    print(f"HCCL set SIGINT trials (seed {SEED}, {n} ranks): {', '.join(outcomes)}")
    assert_bit_identical(workers, daemon, ranks, short_dir, n)
