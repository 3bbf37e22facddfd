"""A CRIU dump that fails (an npusim workload checkpointed with --device none still holds its
driver connection: "External socket is used") rolls back: exit 7, one error line, the
workload runs on unharmed, and no checkpoint directory is left."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import StepGate, Workload, npusnap, requires_criu

from .support import assert_no_checkpoint, one_error_line, proc_state, status, strip_ready, train_argv, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 60, 2, 50


@pytest.fixture(scope="module")
def failed_dump(tmp_path_factory, reference):
    """One failed `checkpoint --device none` of a running training loop; what it left behind."""
    tmp = tmp_path_factory.mktemp("criu-fail")
    d = tempfile.mkdtemp(prefix="npusim-")
    daemon = NpuSimDaemon(socket=os.path.join(d, "npusim.sock"))
    daemon.env = {**os.environ, "NPUSIM_SOCKET": daemon.socket}
    daemon.start()
    gate = StepGate(tmp / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp / "train.out", env={**daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        r = npusnap("checkpoint", w.pid, "-D", tmp / "ck", "--device", "none", env=daemon.env)
        after = {"state": proc_state(w.pid), "status": status(w.pid, daemon.env)}
        gate.open()
        rc = w.proc.wait(timeout=60)
        yield {"result": r, "ck": tmp / "ck", "after": after, "rc": rc, "lines": strip_ready(w.lines()),
               "ref": reference(train_argv(STEPS, 0))}
    finally:
        w.stop()
        daemon.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_failed_dump_rolls_back(failed_dump) -> None:
    r = failed_dump["result"]
    assert r.returncode == 7, r.stderr
    one_error_line(r.stderr)
    assert failed_dump["after"]["state"] not in ("T", "t", "Z", "gone")
    assert failed_dump["after"]["status"]["state"] == "RUNNING"
    assert_no_checkpoint(failed_dump["ck"])
    assert failed_dump["rc"] == 0 and failed_dump["lines"] == failed_dump["ref"]


def test_failed_dump_names_the_real_cause(failed_dump) -> None:
    assert "External socket" in failed_dump["result"].stderr, failed_dump["result"].stderr


def test_failed_dump_hint_names_a_log_that_exists(failed_dump) -> None:
    m = re.search(r"see (\S+\.log)", failed_dump["result"].stderr)
    assert m, failed_dump["result"].stderr
    assert Path(m.group(1)).is_file()
