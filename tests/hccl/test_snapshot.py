"""A process with a live HCCL communicator cannot be checkpointed yet: Lock refuses with CANN's
snapshot code and a note naming the communicator, `npusnap checkpoint` fails with one clear line
and leaves no checkpoint, and both ranks run on, their collectives still right."""

from __future__ import annotations

import json

import pytest

from tests.helpers import npusnap, requires_criu
from tests.pipeline.support import under_agent

pytestmark = [requires_criu, pytest.mark.criu]


def test_checkpoint_refused_while_a_communicator_is_live(daemons, ranks, short_dir) -> None:
    (daemon,) = daemons(1)
    info = str(short_dir / "root.info")
    ranks.start("hold", 0, 2, daemon, info, prefix=under_agent([]))
    peer = ranks.start("hold", 1, 2, daemon, info)
    target = ranks.ranks[0]
    target.wait_for_line("step 3", timeout=60)
    peer.wait_for_line("step 3", timeout=60)

    ck = short_dir / "ck"
    r = npusnap("checkpoint", target.pid, "-D", ck, env={**daemon.env, "LD_LIBRARY_PATH": ranks.ld_path})
    assert r.returncode == 9, (r.returncode, r.stderr)  # DeviceFailed: the Lock was refused
    (line,) = r.stderr.strip().splitlines()  # one line, CANN's ACL_ERROR_SNAPSHOT_LOCK_FAILED in it
    assert "(code 507906)" in line and "HCCL communicator" in line and "(rank 0 of 2)" in line, line
    assert "checkpoint of collectives not yet supported" in line, line
    assert "Traceback" not in r.stderr and not ck.exists()

    (short_dir / "root.info.stop").touch()
    outputs = ranks.wait_all()
    steps = [[x for x in lines if x.startswith("step ")] for lines in outputs]
    assert steps[0] == steps[1], steps  # both ranks stopped after the same collective
    for lines in outputs:
        assert lines[-1] == "done", lines[-5:]
        state = json.loads(next(x for x in lines if x.startswith("info "))[5:])
        assert not state["broken"] and state["seq"] == state["daemon_completed"], state
