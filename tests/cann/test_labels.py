"""Labels in a model run instance (tests/cann/label_steps.c): the switch goes to the label its
device index names (past the end: the last), outside a model labels are refused, and a model with
labels runs on after a real checkpoint, a daemon restart and a restore, its output bit-identical
to an uninterrupted run's."""

from __future__ import annotations

import pytest

from tests.cann.steps import checkpoint_mid_run, reference
from tests.helpers import requires_criu

STEPS, SLEEP_MS = 12, 60
BRANCH = {0: "a0", 1: "b1", 2: "c2", 3: "c2"}  # index 3 is past the list's end: the last label


def test_switch_goes_to_the_indexed_label(npusim_daemon, build_c) -> None:
    out = reference(npusim_daemon, build_c("label_steps"), STEPS)
    # Not bound to a model: ACL_ERROR_RT_STREAM_MODEL; NULL / maxValue past the list: invalid param.
    assert out[0] == "errors set 107005 switch 107005 null 100000 max 100000"
    assert out[1] == "errors again 100000"  # a label is set once
    steps = [line for line in out if line.startswith("step ")]
    assert len(steps) == STEPS and out[-1] == "done"
    for i, line in enumerate(steps):
        v = BRANCH[i % 4]
        assert line == f"step {i} index {i % 4} out {v} {v} {v}"  # the branch's bytes, copied on at END


@requires_criu
@pytest.mark.criu
def test_labels_survive_checkpoint_and_daemon_restart(npusim_daemon, build_c, tmp_path) -> None:
    exe = build_c("label_steps")
    checkpoint_mid_run(npusim_daemon, exe, STEPS, SLEEP_MS, "step 2 ", reference(npusim_daemon, exe, STEPS), tmp_path)
