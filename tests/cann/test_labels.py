"""Labels in a model run instance (tests/cann/label_steps.c): the switch goes to the label its
device index names (past the end: the last), outside a model labels are refused, and a model with
labels runs on after a real checkpoint, a daemon restart and a restore, its output bit-identical
to an uninterrupted run's."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import Workload, npusnap, npusnap_cmd, requires_criu

STEPS, SLEEP_MS = 12, 60
BRANCH = {0: "a0", 1: "b1", 2: "c2", 3: "c2"}  # index 3 is past the list's end: the last label


def _output(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


@pytest.fixture
def reference_run(npusim_daemon, build_c) -> list[str]:
    """The program's output, uninterrupted."""
    ref = subprocess.run([str(build_c("label_steps")), str(STEPS), "0"], env=npusim_daemon.env,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    return _output(ref.stdout.splitlines())


def test_switch_goes_to_the_indexed_label(reference_run) -> None:
    # Not bound to a model: ACL_ERROR_RT_STREAM_MODEL; NULL / maxValue past the list: invalid param.
    assert reference_run[0] == "errors set 107005 switch 107005 null 100000 max 100000"
    assert reference_run[1] == "errors again 100000"  # a label is set once
    steps = [line for line in reference_run if line.startswith("step ")]
    assert len(steps) == STEPS and reference_run[-1] == "done"
    for i, line in enumerate(steps):
        v = BRANCH[i % 4]
        assert line == f"step {i} index {i % 4} out {v} {v} {v}"  # the branch's bytes, copied on at END


@requires_criu
@pytest.mark.criu
def test_labels_survive_checkpoint_and_daemon_restart(npusim_daemon, build_c, reference_run, tmp_path) -> None:
    w = Workload([*npusnap_cmd(), "run", "--", str(build_c("label_steps")), str(STEPS), str(SLEEP_MS)],
                 tmp_path / "out", env=npusim_daemon.env)
    try:
        w.wait_for_line("step 2 ", timeout=30)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, env=npusim_daemon.env, timeout=120)
        assert r.returncode == 0, r.stderr
        at_checkpoint = _output(w.lines())
        assert at_checkpoint == reference_run[: len(at_checkpoint)] and len(at_checkpoint) < len(reference_run)
        w.wait_exit(timeout=10)

        npusim_daemon.restart()  # nothing of the process is left on the device
        rs = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        w.wait_for_line("done", timeout=60)
        assert _output(w.lines()) == reference_run
    finally:
        w.stop()
