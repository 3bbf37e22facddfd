"""Any byte in a checkpoint path works on the direct data path (issue 13): the device images are
opened by npusnap and passed to the daemon as descriptors, so no path is framed in a request.
On main's build the checkpoint succeeds and the restore fails (the Import request is
newline-framed: npusimDaemonImport refuses the directory with ACL_ERROR_INVALID_PARAM)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import StepGate, Workload, npusnap, requires_criu
from tests.pipeline.support import strip_ready, train_argv, train_device_bytes, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 30, 3, 60


def test_newline_in_the_checkpoint_directory_direct_path(npusim_daemon, tmp_path) -> None:
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out",
                 env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        ck = tmp_path / "ck\nwith a newline"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--data-path", "direct", "--json", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["device"]["method"] == "direct"
        assert w.proc.wait(timeout=10) != 0  # killed once committed
        at_checkpoint = strip_ready(w.lines())

        npusim_daemon.restart()  # an empty device: the data must come from the images
        gate.open()
        rs = npusnap("restore", ck, "--json", env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, rs.stderr
        rdoc = json.loads(rs.stdout)
        assert rdoc["exit_code"] == 0
        assert rdoc["phases"][2]["name"] == "device-restore" and rdoc["phases"][2]["bytes"] == train_device_bytes()
        lines = strip_ready(w.lines())
        assert lines[: len(at_checkpoint)] == at_checkpoint and lines[-1].startswith("done")
        steps = [ln for ln in lines if ln.startswith("step ")]
        assert [int(ln.split()[1]) for ln in steps] == list(range(len(steps)))  # no step lost or repeated
    finally:
        w.stop()
