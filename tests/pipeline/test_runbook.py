"""The runbook, one command per phase: status, lock, backup, dump, restore --criu-only
--detach, device-restore, unlock. Gives the same final output as the pipeline; a wrong
order is refused with exit 11 and changes nothing; status reports every state."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu

from .support import assert_no_checkpoint, one_error_line, status, strip_ready, train_argv, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 100, 2, 50  # ~5 s: room for a dozen CLI calls (0.3-1 s each) before the lock


def _state(pid: int, env: dict, expected: str) -> None:
    doc = status(pid, env)
    assert doc["agent"] is True and doc["state"] == expected, doc
    assert doc["stopped"] is False, doc
    assert doc["device"]["state"] == expected, doc


def _refused(env: dict, *args: object) -> None:
    r = npusnap(*args, env=env)
    assert r.returncode == 11, f"npusnap {' '.join(map(str, args))} exited {r.returncode}: {r.stderr}"
    one_error_line(r.stderr)


def _phase(env: dict, pid: int, cmd: str, expected: str) -> None:
    r = npusnap(cmd, pid, "--json", env=env)
    assert r.returncode == 0, (cmd, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["kind"] == cmd and doc["pid"] == pid and doc["state"] == expected, doc


def test_runbook_phase_by_phase(npusim_daemon, reference, tmp_path) -> None:
    ref = reference(train_argv(STEPS, 0))
    env = npusim_daemon.env
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out", env={**env, **gate.env})
    ck = tmp_path / "ck"
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        _state(w.pid, env, "RUNNING")

        # RUNNING: nothing but lock is accepted.
        _refused(env, "dump", w.pid, "-D", ck)                     # dump before lock and backup
        assert_no_checkpoint(ck)
        _refused(env, "backup", w.pid)                             # backup before lock
        _refused(env, "device-restore", w.pid)                     # device-restore while RUNNING
        _state(w.pid, env, "RUNNING")
        n = len(w.lines())
        w.wait_for_line(n + 1, timeout=10)                         # still making progress

        _phase(env, w.pid, "lock", "LOCKED")
        _state(w.pid, env, "LOCKED")
        frozen = len(w.lines())
        _refused(env, "dump", w.pid, "-D", ck)                     # dump before backup
        assert_no_checkpoint(ck)
        _refused(env, "lock", w.pid)                               # locked twice
        _refused(env, "device-restore", w.pid)                     # nothing backed up yet
        _state(w.pid, env, "LOCKED")

        _phase(env, w.pid, "backup", "BACKED_UP")
        _state(w.pid, env, "BACKED_UP")
        _refused(env, "lock", w.pid)
        _state(w.pid, env, "BACKED_UP")
        time.sleep(0.3)
        assert len(w.lines()) <= frozen + 1, "the workload's device calls went on while locked"

        d = npusnap("dump", w.pid, "-D", ck, "--json", env=env)
        assert d.returncode == 0, d.stderr
        assert json.loads(d.stdout)["left_running"] is False
        assert w.proc.wait(timeout=10) == -signal.SIGKILL and not pid_alive(w.pid)
        assert len(strip_ready(w.lines())) < STEPS

        npusim_daemon.restart()
        gate.open()
        r = npusnap("restore", ck, "--criu-only", "--detach", "--json", env=env)
        assert r.returncode == 0, r.stderr
        rdoc = json.loads(r.stdout)
        assert rdoc["pid"] == w.pid
        assert [p["name"] for p in rdoc["phases"]] == ["verify", "criu-restore"]
        _state(w.pid, env, "BACKED_UP")                            # restored by CRIU, device still on the host
        _refused(env, "lock", w.pid)

        _phase(env, w.pid, "device-restore", "LOCKED")
        _state(w.pid, env, "LOCKED")
        _phase(env, w.pid, "unlock", "RUNNING")
        _state(w.pid, env, "RUNNING")
        _refused(env, "device-restore", w.pid)                     # device-restore while RUNNING
        _refused(env, "unlock", w.pid)                             # unlock while RUNNING

        w.wait_exit(timeout=60)
        assert strip_ready(w.lines()) == ref
    finally:
        w.stop()
