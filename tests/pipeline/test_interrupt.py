"""Ctrl-C during each phase of `npusnap checkpoint` (NPUSNAP_TEST_PAUSE holds the CLI at the
point): exit 130 with one error line, and the workload is running, unlocked, not stopped, no
checkpoint directory (nor staging leftover) exists, and it finishes with the uninterrupted
run's output."""

from __future__ import annotations

import queue
import signal
import subprocess
import threading

import pytest

from tests.helpers import StepGate, Workload, npusnap_cmd, requires_criu

from .support import (
    assert_no_checkpoint,
    lines_into,
    one_error_line,
    proc_state,
    status,
    strip_ready,
    train_argv,
    under_agent,
)

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 60, 2, 50  # ~3 s: room for the CLI to reach the pause on a loaded machine

POINTS = ["before:lock", "after:lock",
          "before:backup", "after:backup", "before:dump", "after:dump", "before:seal"]


@pytest.mark.parametrize("point", POINTS)
def test_ctrl_c_rolls_back(npusim_daemon, reference, tmp_path, point: str) -> None:
    ref = reference(train_argv(STEPS, 0))
    env = npusim_daemon.env
    gate = StepGate(tmp_path / "gate", STEPS - 2)  # opened once the CLI is gone
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out", env={**env, **gate.env})
    ck = tmp_path / "ck"
    cli = None
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        cli = subprocess.Popen([*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(ck)],
                               env={**env, "NPUSNAP_TEST_PAUSE": point}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        q: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=lines_into, args=(cli.stderr, q), daemon=True).start()
        first = q.get(timeout=30)
        assert first.strip() == f"npusnap: test pause {point}", first
        assert w.proc.poll() is None, "the workload ended before the pause; make it longer"

        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=30) == 130
        rest = []
        while (line := q.get(timeout=10)):
            rest.append(line)
        err = one_error_line("".join(rest))
        assert "interrupted" in err and len(rest) == 1, rest  # nothing else (no failed undo)

        assert proc_state(w.pid) not in ("T", "t", "Z", "gone"), proc_state(w.pid)
        doc = status(w.pid, env)
        assert doc["state"] == "RUNNING" and doc["stopped"] is False, doc
        assert doc["device"]["state"] == "RUNNING", doc
        assert_no_checkpoint(ck)

        gate.open()
        assert w.proc.wait(timeout=60) == 0  # carries on to the end
        assert strip_ready(w.lines()) == ref
    finally:
        if cli is not None:
            if cli.poll() is None:
                cli.kill()
            cli.wait()
            for s in (cli.stdout, cli.stderr):
                s.close()
        w.stop()
