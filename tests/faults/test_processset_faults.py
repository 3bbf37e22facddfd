"""A process set's failure rule with real CRIU and a real daemon (three examples/train.py runs on
npusim devices 0, 1, 0): a failure injected in member k at each phase of `npusnap checkpoint PID
PID PID` (testhooks' NPUSNAP_TEST_FAIL) leaves every member running, unlocked, with its data,
and no checkpoint; a member that exits mid-checkpoint fails the set and the others are undone;
a restore failure in one member leaves no member running and the checkpoint intact for a retry;
SIGINT at random instants of a set checkpoint and a set restore (a bounded loop; `make faults`
runs more: NPUSNAP_FAULT_SET_SIGINT) ends in the outcome reported, never a stopped orphan."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import npusnap, npusnap_cmd, pid_alive, requires_criu, rewind_to_checkpoint

from .support import (
    DOCUMENTED_CODES,
    PausedCli,
    Reference,
    Workload,
    assert_failed_cleanly,
    assert_no_valid_checkpoint,
    assert_running_intact,
    one_error_line,
    start_train,
    wait_recovers,
)
from .test_random_faults import SEED, _fault, tagged, wait_gone

pytestmark = [requires_criu, pytest.mark.criu]

DEVICES = (0, 1, 0)
SIGINTS = int(os.environ.get("NPUSNAP_FAULT_SET_SIGINT") or 4)


def _start(tmp_path: Path, env: dict[str, str], steps: int = 3000, tag: str = "") -> list[Workload]:
    env = {**env, "NPUSNAP_TEST_TAG": tag} if tag else env
    ws: list[Workload] = []
    try:
        for i, device in enumerate(DEVICES):
            ws.append(start_train(tmp_path, env, name=f"m{i}-{uuid.uuid4().hex[:6]}", steps=steps, sleep_ms=30,
                                  scratch_mb=1, device=device))
    except BaseException:
        _stop(ws)
        raise
    return ws


def _stop(ws: list[Workload]) -> None:
    for w in ws:
        w.stop()
        if pid_alive(w.pid):  # a restored incarnation is not our child
            os.kill(w.pid, signal.SIGKILL)


@pytest.fixture
def members(npusim_daemon, tmp_path) -> Iterator[list[Workload]]:
    ws = _start(tmp_path, npusim_daemon.env)
    try:
        yield ws
    finally:
        _stop(ws)


# (where the failure is injected, which member: None for the set's own phases)
POINTS = [("after:lock", 0), ("after:lock", 2), ("after:backup", 1), ("before:dump", 2), ("after:dump", 0),
          ("after:dump", 2), ("after:seal", None), ("before:backup", 1)]


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_a_failure_in_member_k_at_each_phase_undoes_every_member(members, npusim_daemon, reference: Reference,
                                                                 tmp_path, data_path) -> None:
    env = npusim_daemon.env
    pids = [w.pid for w in members]
    for n, (point, k) in enumerate(POINTS):
        where = point if k is None else f"{point}@{pids[k]}"
        target = tmp_path / f"ck{n}"
        r = npusnap("checkpoint", *pids, "-D", target, "--data-path", data_path, env={**env, "NPUSNAP_TEST_FAIL": where})
        line = assert_failed_cleanly(r, {3})
        assert f"test failure injected at {where}" in line, line
        if k is not None:
            assert f"process {pids[k]} (set member {k + 1} of 3)" in line, line
        assert_no_valid_checkpoint(target)
        for w in members:
            assert_running_intact(w, reference, env)
    r = npusnap("checkpoint", *pids, "-D", tmp_path / "ck", "--data-path", data_path, "--leave-running", env=env)
    assert r.returncode == 0, r.stderr  # and after all that, the set still checkpoints
    for w in members:
        assert_running_intact(w, reference, env)


def test_a_member_that_exits_mid_checkpoint_fails_the_set(members, npusim_daemon, reference: Reference,
                                                          tmp_path) -> None:
    env = npusim_daemon.env
    pids = [w.pid for w in members]
    target = tmp_path / "ck"
    cli = PausedCli(["checkpoint", *pids, "-D", target], f"before:dump@{pids[1]}",
                    {**env, "NPUSNAP_TEST_PAUSE_S": "2"})
    try:
        members[1].stop()  # member 2 exits while member 1 is dumped and member 3 waits, locked
        _, err = cli.proc.communicate(timeout=120)
        err = cli.stderr + err.decode()
    finally:
        cli.kill()
    assert cli.proc.returncode in DOCUMENTED_CODES - {3, 130}, err
    line = one_error_line(err)
    assert f"process {pids[1]} (set member 2 of 3)" in line, line
    assert_no_valid_checkpoint(target)
    for w in (members[0], members[2]):
        assert_running_intact(w, reference, env)


@pytest.mark.parametrize("point", ["after:lock", "before:dump@{pid2}", "after:dump@{pid3}"])
def test_the_cli_sigkilled_mid_set_every_member_comes_back(point, members, npusim_daemon, reference: Reference,
                                                          tmp_path) -> None:
    """The guardian resumes every member CRIU left stopped and, on the direct path, puts each
    member's staged device data back (device/PID/); the leases unlock the rest."""
    env = npusim_daemon.env
    pids = [w.pid for w in members]
    target = tmp_path / "ck"
    cli = PausedCli(["checkpoint", *pids, "-D", target, "--data-path", "direct"],
                    point.format(pid2=pids[1], pid3=pids[2]), env)
    cli.kill()
    for w in members:
        wait_recovers(w, bound=30, env=env)
        assert_running_intact(w, reference, env)
    assert_no_valid_checkpoint(target, partial_ok=True)


def test_a_restore_failure_in_one_member_leaves_none_running(npusim_daemon, reference: Reference, tmp_path) -> None:
    env = npusim_daemon.env
    ws = _start(tmp_path, env, steps=300)
    try:
        pids = [w.pid for w in ws]
        ck = tmp_path / "ck"
        npusnap("checkpoint", *pids, "-D", ck, env=env, check=True)
        for w in ws:
            w.proc.wait(timeout=10)
        npusim_daemon.restart()
        for where in (f"after:criu-restore@{pids[1]}", f"before:device-restore@{pids[2]}",
                      f"after:device-restore@{pids[2]}", "before:unlock"):
            r = npusnap("restore", ck, "--detach", env={**env, "NPUSNAP_TEST_FAIL": where})
            line = assert_failed_cleanly(r, {3})
            assert where in line, line
            for pid in pids:
                wait_gone(pid)  # every member restored so far was killed (and reaped: no zombie either)
            npusnap("verify", ck, check=True)
            for w in ws:
                rewind_to_checkpoint(ck, w.out, member=w.pid)
        r = npusnap("restore", ck, "--json", env=env, timeout=180)  # the retry restores the whole set
        assert r.returncode == 0, r.stderr
        for w in ws:
            reference.check(w.lines())
            assert w.lines()[-1].startswith("done"), w.lines()[-3:]
    finally:
        _stop(ws)


# ---------------------------------------------------------------- SIGINT at random instants


def _assert_no_stray(tag: str, keep: set[int]) -> None:
    deadline = time.monotonic() + 10
    while True:
        found = tagged(tag)
        stopped = {p: s for p, s in found.items() if s[0] in ("T", "t")}
        stray = {p: s for p, s in found.items() if p not in keep}
        if not stopped and not stray:
            return
        assert time.monotonic() < deadline, f"seed {SEED}: stopped {stopped}, stray {stray}"
        time.sleep(0.1)


def test_sigint_at_random_instants_of_a_set_checkpoint_and_restore(npusim_daemon, reference: Reference,
                                                                   tmp_path) -> None:
    tag = uuid.uuid4().hex
    env = {**npusim_daemon.env, "NPUSNAP_TEST_TAG": tag}
    rng = random.Random(f"{SEED}:set")
    seconds = {"checkpoint": 2.0, "restore": 1.5}
    ws = _start(tmp_path, npusim_daemon.env, steps=100000, tag=tag)
    running, ready = True, None  # ready: a checkpoint of the set while the members are gone
    outcomes: list[str] = []
    try:
        for i in range(2 * SIGINTS):
            op = "checkpoint" if running else "restore"
            target = tmp_path / f"ck{i}" if running else ready
            assert target is not None
            args = ["checkpoint", *(w.pid for w in ws), "-D", target, "--data-path",
                    ("direct", "in-process")[i // 2 % 2]] if running else ["restore", "--detach", target]
            delay = rng.uniform(0.0, seconds[op])
            what = f"seed {SEED} trial {i}: {op}, SIGINT after {delay:.3f} s"
            start = time.monotonic()
            cli = subprocess.Popen([*npusnap_cmd(), *map(str, args)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                landed, early = _fault(cli, "SIGINT", delay, 0)
                _, err = cli.communicate(timeout=180)
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.communicate()
            if not landed:
                seconds[op] = 0.7 * seconds[op] + 0.3 * (time.monotonic() - start)
            rc = cli.returncode
            if rc == -signal.SIGINT and not err and early:
                outcomes.append("interrupted inside execve")  # nothing of ours ran: the state is unchanged
            else:
                assert rc in {0} | DOCUMENTED_CODES and "Traceback" not in err, f"{what}: exit {rc}: {err}"
                if rc != 0:
                    one_error_line(err)
                outcomes.append("finished before the signal" if not landed else f"exit {rc}")
                if op == "checkpoint" and rc == 0:  # committed: every member gone, the set verifies
                    for w in ws:
                        wait_gone(w.pid)
                    npusnap("verify", target, check=True)
                    running, ready = False, target
                elif op == "checkpoint":
                    assert_no_valid_checkpoint(target, partial_ok=False)
                elif rc == 0:  # restored: every member runs on, unlocked
                    running, ready = True, None
                else:  # rolled back: no member left, the checkpoint intact and restorable
                    for w in ws:
                        wait_gone(w.pid)
                    npusnap("verify", target, check=True)
                    for w in ws:
                        rewind_to_checkpoint(target, w.out, member=w.pid)
            if running:
                for w in ws:
                    wait_recovers(w, env=npusim_daemon.env)
                    assert_running_intact(w, reference, npusim_daemon.env)
            else:
                assert not any(pid_alive(w.pid) for w in ws), what
            _assert_no_stray(tag, {w.pid for w in ws} if running else set())
    finally:
        _stop(ws)
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    print(f"set SIGINT trials (seed {SEED}): {', '.join(outcomes)}")
