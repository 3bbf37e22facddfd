"""HCCL ranks restored onto another device daemon (as on another host): the ranks started on
daemon A (their NPUSIM_SOCKET names it) are checkpointed as a set and A is gone; `npusnap restore
--device-socket B` hands every runtime B's socket before its device restore, so the ranks
reconnect to B, re-form their communicator there, and finish bit-identical to an uninterrupted
run. Without it the restore refuses before anything starts (A does not answer), the checkpoint
intact."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers import npusnap, requires_criu

from .test_snapshot import finish_and_compare, start_training, uninterrupted

pytestmark = [requires_criu, pytest.mark.criu]


def _clients(env: dict[str, str], sock: str) -> set[int]:
    r = npusnap("device", "status", "--socket", sock, "--json", env=env)
    return {int(c["pid"]) for c in json.loads(r.stdout).get("clients", [])} if r.returncode == 0 else set()


def test_ranks_restored_onto_another_daemon_use_it(daemons, ranks, short_dir: Path) -> None:
    want = uninterrupted(2, daemons, ranks, short_dir)
    a, b = daemons(2)
    env = {**a.env, "LD_LIBRARY_PATH": ranks.ld_path}  # the ranks' and this npusnap's: daemon A
    # Slow steps (the results do not depend on them): the restored ranks still train for seconds
    # when asked whose clients they are, however slowly a loaded host runs that question; then
    # the steps left run unpaused (HCCL_TRAIN_FAST).
    fast = short_dir / "fast"
    workers = start_training(ranks, a, 2, str(short_dir / "moved.info"),
                             env={"HCCL_TRAIN_SLEEP_US": "150000", "HCCL_TRAIN_FAST": str(fast)})
    for w in workers:
        w.wait_for_line("step 2", timeout=60)
    ck = short_dir / "set"
    r = npusnap("checkpoint", *[w.pid for w in workers], "-D", ck, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    for w in workers:
        w.wait_exit(timeout=30)
    a.stop()

    r = npusnap("restore", ck, "--detach", env=env, timeout=120)  # A is gone: refused, nothing started
    assert r.returncode != 0 and "none answers there" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert all(not Path(f"/proc/{w.pid}").exists() for w in workers)

    r = npusnap("restore", ck, "--detach", "--device-socket", b.socket, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    pids = {w.pid for w in workers}
    deadline = time.monotonic() + 30
    while not pids <= _clients(env, b.socket):
        assert time.monotonic() < deadline, (pids, _clients(env, b.socket))
        time.sleep(0.05)
    fast.touch()
    finish_and_compare(workers, want, 0, 0.0)
