"""HcclSend/HcclRecv at Lock: a Send is done once the root daemon holds its data, so a rank can be
locked (and backed up) while its data waits there for a Recv the peer has not issued. That data
lives only in the root, which the ranks leave at Backup: a checkpoint then would lose it. The
lock instead waits, after its drain, until every Send to or from the rank was received, and ends
in the lock timeout (exit 10, naming the unmatched Send) when the Recv does not come; both ranks
run on unlocked, and the Recv still gets the data."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import npusnap
from tests.pipeline.support import under_agent

from .test_snapshot import cli_env, on_all


def test_a_send_not_yet_received_keeps_the_lock_from_completing(daemons, ranks, short_dir: Path) -> None:
    (daemon,) = daemons(1)
    env = cli_env(daemon, ranks)
    info = short_dir / "root.info"
    workers = [ranks.start("sendlate", r, 2, daemon, str(info), prefix=under_agent([])) for r in range(2)]
    workers[0].wait_for_line("sent", timeout=60)
    workers[1].wait_for_line("waiting", timeout=60)
    done = on_all([w.pid for w in workers], "lock", "ITEM", "--timeout", "3", env=env)
    for w, r in zip(workers, done):
        assert r.returncode == 10, (w.pid, r.returncode, r.stderr)  # LockTimeout: no torn Send/Recv
        (line,) = r.stderr.strip().splitlines()
        assert "1 HcclSend(s) between this rank and rank" in line and "not received" in line, line
        status = json.loads(npusnap("status", w.pid, "--json", env=env).stdout)
        assert status["state"] == "RUNNING", status
    (short_dir / "root.info.go").touch()
    outputs = ranks.wait_all()
    assert "recv ok" in outputs[1] and outputs[0][-1] == "done", outputs
