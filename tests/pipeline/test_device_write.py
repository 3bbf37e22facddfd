"""The direct path's device images, written by the daemon while CRIU dumps (core/checkpoint.py,
keep_device_memory): the backup is a copy-on-write snapshot the daemon keeps across it. A failure
before or after the write-out, or a Ctrl-C while it is held, rolls back with the memory taken back
in place: the workload runs on unlocked and bit-exact, no checkpoint and no snapshot is left, and
the daemon counts none of the memory kept for the rollback once the workload has ended."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading

import pytest

from tests.helpers import StepGate, Workload, npusnap, npusnap_cmd, requires_criu

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

STEPS, AT, SLEEP_MS = 60, 2, 50


def _daemon(env: dict[str, str]) -> dict:
    r = npusnap("device", "status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _assert_rolled_back(w: Workload, gate: StepGate, ck, ref, env: dict[str, str]) -> None:
    assert proc_state(w.pid) not in ("T", "t", "Z", "gone"), proc_state(w.pid)
    doc = status(w.pid, env)
    assert doc["state"] == "RUNNING" and doc["device"]["state"] == "RUNNING", doc
    assert_no_checkpoint(ck)
    assert _daemon(env)["snapshots"] == 0
    gate.open()
    assert w.proc.wait(timeout=60) == 0
    assert strip_ready(w.lines()) == ref  # every device byte came back
    assert all(d["used"] == 0 for d in _daemon(env)["devices"])


@pytest.mark.parametrize("point", ["during:device-write", "after:device-write"])
def test_a_failure_of_the_write_out_rolls_back_in_place(npusim_daemon, reference, tmp_path, point: str) -> None:
    # during: the snapshot is still held; after: the images are written and the snapshot ended,
    # so only the memory the daemon kept brings the data back.
    ref = reference(train_argv(STEPS, 0))
    env = npusim_daemon.env
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out", env={**env, **gate.env})
    ck = tmp_path / "ck"
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        r = npusnap("checkpoint", w.pid, "-D", ck, env={**env, "NPUSNAP_TEST_FAIL": point})
        assert r.returncode == 3, r.stderr
        assert f"test failure injected at {point}" in one_error_line(r.stderr)
        _assert_rolled_back(w, gate, ck, ref, env)
    finally:
        w.stop()


def test_ctrl_c_while_the_images_are_written(npusim_daemon, reference, tmp_path) -> None:
    ref = reference(train_argv(STEPS, 0))
    env = npusim_daemon.env
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out", env={**env, **gate.env})
    ck = tmp_path / "ck"
    cli = None
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        # The write-out holds before its first byte; the rollback's drop of the snapshot ends the hold.
        cli = subprocess.Popen([*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(ck)],
                               env={**env, "NPUSNAP_TEST_PAUSE": "during:device-write"},
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=lines_into, args=(cli.stderr, lines), daemon=True).start()
        assert lines.get(timeout=30).strip() == "npusnap: test pause during:device-write"
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=60) == 130
        rest = []
        while (line := lines.get(timeout=10)):
            rest.append(line)
        assert "interrupted" in one_error_line("".join(rest)) and len(rest) == 1, rest
        _assert_rolled_back(w, gate, ck, ref, env)
    finally:
        if cli is not None:
            if cli.poll() is None:
                cli.kill()
            cli.wait()
        w.stop()
