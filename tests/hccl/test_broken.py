"""A broken communicator at Lock: a peer rank's process died (it left the communicator without
being locked), so no lock of its peers can ever complete. Each surviving rank's lock refuses at
once with one clear HCCL error line (exit 9, a device runtime failure), not the lock timeout
(exit 10), and the rank runs on, unlocked."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.helpers import npusnap
from tests.pipeline.support import under_agent

from .test_snapshot import cli_env, on_all

LOCK_TIMEOUT_S = "60"  # a regression would wait all of it and end in exit 10


@pytest.mark.parametrize("n, dead", [(2, 1), (4, 2)])
def test_lock_refuses_when_a_peer_process_died(n: int, dead: int, daemons, ranks, short_dir: Path) -> None:
    (daemon,) = daemons(1)
    env = cli_env(daemon, ranks)
    info = str(short_dir / "root.info")
    workers = [ranks.start("idle", r, n, daemon, info, prefix=under_agent([])) for r in range(n)]
    for w in workers:
        w.wait_for_line("joined", timeout=60)
    workers[dead].proc.send_signal(signal.SIGKILL)
    workers[dead].proc.wait(timeout=30)
    alive = [w for i, w in enumerate(workers) if i != dead]
    done = on_all([w.pid for w in alive], "lock", "ITEM", "--timeout", LOCK_TIMEOUT_S, env=env)
    for w, r in zip(alive, done):
        assert r.returncode == 9, (w.pid, r.returncode, r.stderr)  # DeviceFailed, not LockTimeout (10)
        (line,) = r.stderr.strip().splitlines()
        assert "lock refused" in line and f"rank {dead} left it without being locked" in line, line
        assert "HcclResult 21" in line, line  # HCCL_E_REMOTE
        status = json.loads(npusnap("status", w.pid, "--json", env=env).stdout)
        assert status["state"] == "RUNNING", status
        assert w.proc.poll() is None, w.lines()[-3:]  # untouched: it runs on


def test_a_forced_lock_alone_still_locks_beside_a_dead_peer(daemons, ranks, short_dir: Path) -> None:
    """--force checkpoints a rank without its peers: a dead peer does not stop it (its
    communicator's next call fails, as for any rank checkpointed alone)."""
    (daemon,) = daemons(1)
    env = cli_env(daemon, ranks)
    workers = [ranks.start("idle", r, 2, daemon, str(short_dir / "root.info"), prefix=under_agent([]))
               for r in range(2)]
    for w in workers:
        w.wait_for_line("joined", timeout=60)
    workers[1].proc.send_signal(signal.SIGKILL)
    workers[1].proc.wait(timeout=30)
    r = npusnap("checkpoint", workers[0].pid, "-D", short_dir / "ck", "--force", "--leave-running", env=env,
                timeout=120)
    assert r.returncode == 0, (r.stderr, workers[0].proc.poll(), workers[0].lines()[-5:])
    status = json.loads(npusnap("status", workers[0].pid, "--json", env=env).stdout)
    assert status["state"] == "RUNNING", status
