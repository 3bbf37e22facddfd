"""`npusnap attach`: a Python process on npusim started without `npusnap run` gets the agent
injected, then is checkpointed, killed, and restored on a restarted daemon."""

from __future__ import annotations

import json
import signal

import pytest

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu

from .support import attach_argv, env_without_preload, proc_state, status, strip_ready

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, SLEEP_MS = 60, 60  # ~3.6 s: room for four CLI calls before the checkpoint


def test_attach_then_checkpoint_and_restore(npusim_daemon, reference, tmp_path) -> None:
    ref = reference(attach_argv(STEPS, 0))
    env = env_without_preload(npusim_daemon.env)
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(attach_argv(STEPS, SLEEP_MS), tmp_path / "attach.out", env={**env, **gate.env})
    try:
        w.wait_for_line("step 1 ", timeout=60)
        assert status(w.pid, env)["agent"] is False

        r = npusnap("attach", w.pid, "--json", env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["injected"] is True and doc["state"] == "RUNNING"
        assert doc["runtime"].endswith("/libascendcl.so")  # found although Python loaded it RTLD_LOCAL
        assert proc_state(w.pid) not in ("T", "t")  # never left stopped
        again = npusnap("attach", w.pid, "--json", env=env)
        assert again.returncode == 0 and json.loads(again.stdout)["injected"] is False

        w.wait_for_line(len(w.lines()) + 1, timeout=30)  # still making progress after the injection
        ck = tmp_path / "ck"
        c = npusnap("checkpoint", w.pid, "-D", ck, "--json", env=env)
        assert c.returncode == 0, c.stderr
        dev = json.loads(c.stdout)["device"]
        assert dev["backend"] == "sim" and dev["allocations"] == 2 and dev["bytes"] == 2 * (1 << 16) * 4
        assert w.proc.wait(timeout=10) == -signal.SIGKILL and not pid_alive(w.pid)
        assert len(strip_ready(w.lines())) < STEPS

        npusim_daemon.restart()
        gate.open()
        rs = npusnap("restore", ck, env=env, timeout=120)
        assert rs.returncode == 0, rs.stderr
        assert strip_ready(w.lines()) == ref
    finally:
        w.stop()
