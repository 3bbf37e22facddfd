"""Every resource kind of the CANN runtime surface live across a real checkpoint
(tests/cann/cann_resources.c): a created context current in a subscribed report thread, streams
with priority, flags and a failure mode (odd steps queue a failing copy: ACL_STOP_ON_FAILURE drops
the work behind it), events made with flags, host functions and report
callbacks queued on the streams, an external allocator, a tdt channel and routed queues holding
items. Checkpoint mid-run, kill, restart the
daemon, restore: the output equals an uninterrupted run's, and `npusnap inspect` lists each kind."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu
from tests.pipeline.support import strip_ready, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 40, 4, 30  # ~1.5 s


def test_cann_resources_survive_checkpoint_daemon_restart_restore(npusim_daemon, device_env, build_program,
                                                                   tmp_path) -> None:
    exe = build_program("cann_resources")
    env = {**npusim_daemon.env, "LD_LIBRARY_PATH": device_env["LD_LIBRARY_PATH"]}
    ref = subprocess.run([str(exe), str(STEPS), "0"], env=env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert ref.returncode == 0, ref.stdout[-1000:] + ref.stderr[-1000:]
    expected = strip_ready(ref.stdout.splitlines())
    assert len(expected) == STEPS + 1 and expected[-1].startswith("done")

    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent([str(exe), str(STEPS), str(SLEEP_MS)]), tmp_path / "out", env={**env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--json", env=env)
        assert r.returncode == 0, r.stderr
        resources = json.loads(r.stdout)["device"]["resources"]
        # default + created context; default streams of both, sA, sB; evA, evB; a subscription.
        assert resources["contexts"] == 2 and resources["streams"] == 4 and resources["events"] == 2, resources
        assert resources["callbacks"] >= 1 and resources["memory"] == 1, resources
        assert resources["tdt_channels"] == 1 and resources["tdt_queues"] == 2, resources
        assert w.proc.wait(timeout=10) == -signal.SIGKILL and not pid_alive(w.pid)
        at_checkpoint = strip_ready(w.lines())
        assert AT < len(at_checkpoint) < STEPS and at_checkpoint == expected[: len(at_checkpoint)]

        shown = npusnap("inspect", ck, "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["device"]["resources"] == resources
        tree = " ".join(npusnap("inspect", ck, env={**env, "COLUMNS": "200"}).stdout.split())
        listed = tree[tree.index("resources:"):]
        for kind in ("memory", "contexts", "streams", "events", "callbacks", "tdt_channels", "tdt_queues"):
            assert f"{kind} {resources[kind]}" in listed, listed

        npusim_daemon.restart()
        gate.open()
        rs = npusnap("restore", ck, env=env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        assert strip_ready(w.lines()) == expected
    finally:
        w.stop()
