"""Virtual memory (reservations, physical allocations, mappings) and notifies across a real
checkpoint: npusnap checkpoints tests/cann/vmm_notify_steps.c mid-run (the process dies), the
daemon restarts, npusnap restores; the output equals an uninterrupted run's, bit for bit."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import StepGate, Workload, npusnap, npusnap_cmd, requires_criu

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, SLEEP_MS = 24, 60


def _output(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


def test_vmm_and_notify_survive_checkpoint_and_daemon_restart(npusim_daemon, build_c, tmp_path) -> None:
    exe = build_c("vmm_notify_steps")
    ref = subprocess.run([str(exe), str(STEPS), "0"], env=npusim_daemon.env, capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    expected = _output(ref.stdout.splitlines())
    assert expected[-1] == "done" and "idle wait 507046" in expected and "access 3 notify id 1" in expected

    gate = StepGate(tmp_path / "gate", STEPS - 3)  # an odd step, as step 5: the notify recorded, not waited
    w = Workload([*npusnap_cmd(), "run", "--", str(exe), str(STEPS), str(SLEEP_MS)], tmp_path / "out",
                 env={**npusim_daemon.env, **gate.env})
    try:
        # After an odd step the notify is recorded and not yet waited for: its state must be carried.
        w.wait_for_line("step 5 ", timeout=30)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--json", env=npusim_daemon.env, timeout=120)
        assert r.returncode == 0, r.stderr
        at_checkpoint = _output(w.lines())
        assert 5 < len(at_checkpoint) < STEPS and at_checkpoint == expected[: len(at_checkpoint)]
        doc = json.loads(r.stdout)
        assert doc["device"]["backend"] == "sim"
        w.wait_exit(timeout=10)

        info = npusnap("inspect", ck, "--json", env=npusim_daemon.env)
        assert info.returncode == 0, info.stderr

        npusim_daemon.restart()  # nothing of the process is left on the device
        gate.open()
        rs = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        w.wait_for_line("done", timeout=60)
        assert _output(w.lines()) == expected
    finally:
        w.stop()
