"""HcclSend/HcclRecv at Lock. A Send is done once the root daemon holds its data, so a rank could
be locked (and backed up) while its data waits there for a Recv the peer has not issued; the root,
which the ranks leave at Backup, would lose it. The lock's free pass covers the pair: while a
peer's Sends to a rank outnumber the rank's Recvs from it, the rank's Recvs (and the calls on the
way to them) pass the gate, and after its drain a lock waits until every Send to or from the rank
was received. Likewise a rank's Sends pass while a peer's queued Recvs from it outnumber them. A
Recv the application does not issue in time ends in the lock timeout (exit 10, naming the pair),
every rank running on unlocked; the Recv still gets the data."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from npusnap_cli._protocol import CTL_CMD_STATE, CTL_SOCKET_PREFIX
from tests.helpers import npusnap
from tests.pipeline.support import under_agent

from .test_snapshot import cli_env, on_all


def _start(ranks, daemons, short_dir: Path, mode: str = "sendlate"):
    (daemon,) = daemons(1)
    workers = [ranks.start(mode, r, 2, daemon, str(short_dir / "root.info"), prefix=under_agent([]))
               for r in range(2)]
    workers[0].wait_for_line("sent" if mode == "sendlate" else "waiting", timeout=60)
    workers[1].wait_for_line("waiting" if mode == "sendlate" else "queued", timeout=60)
    return cli_env(daemon, ranks), workers


def runtime_state(pid: int) -> str:
    """A rank's runtime state from npusim's by-pid control listener (native/npusim/ctl.cpp), which
    answers while a lock is in flight (the agent serves one command at a time)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect("\0" + CTL_SOCKET_PREFIX + str(pid))
        s.sendall(CTL_CMD_STATE.encode() + b"\n")
        return s.makefile().readline().split()[1]


def go_once_locking(workers, go: Path) -> threading.Thread:
    """Touch go once every rank's lock has begun (its runtime LOCKED, the free pass open): the Send
    or Recv it releases comes while the locks wait, however late a loaded host starts them."""
    def run() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(runtime_state(w.pid) != "LOCKED" for w in workers):
            time.sleep(0.02)
        go.touch()  # past the deadline too: the ranks then end instead of waiting for it

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_a_send_never_received_ends_in_the_lock_timeout(daemons, ranks, short_dir: Path) -> None:
    env, workers = _start(ranks, daemons, short_dir)
    done = on_all([w.pid for w in workers], "lock", "ITEM", "--timeout", "3", env=env)
    lines = []
    for w, r in zip(workers, done):
        assert r.returncode == 10, (w.pid, r.returncode, r.stderr)  # LockTimeout: no torn Send/Recv
        (line,) = r.stderr.strip().splitlines()
        assert "lock timed out" in line, line
        lines.append(line)
    # The receiver names the pair; the sender too, unless the receiver's lock ended (and withdrew) first.
    assert "rank 0 sent it 1 HcclSend(s), it issued 0 HcclRecv(s) from that rank" in lines[1], lines
    assert ("1 HcclSend(s) between this rank and rank 1 not received by an HcclRecv" in lines[0]
            or "not every rank is being locked" in lines[0]), lines
    for w in workers:
        status = json.loads(npusnap("status", w.pid, "--json", env=env).stdout)
        assert status["state"] == "RUNNING", status
    (short_dir / "root.info.go").touch()
    (short_dir / "root.info.end").touch()
    outputs = ranks.wait_all()
    assert "recv ok" in outputs[1] and outputs[0][-1] == "done", outputs


def test_a_recv_issued_while_locking_passes_and_the_lock_completes(daemons, ranks, short_dir: Path) -> None:
    env, workers = _start(ranks, daemons, short_dir)
    go = go_once_locking(workers, short_dir / "root.info.go")  # the Recv comes once the locks wait
    done = on_all([w.pid for w in workers], "lock", "ITEM", "--timeout", "60", env=env)
    go.join(timeout=60)
    for w, r in zip(workers, done):
        assert r.returncode == 0, (w.pid, r.returncode, r.stderr)
        status = json.loads(npusnap("status", w.pid, "--json", env=env).stdout)
        assert status["state"] == "LOCKED", status
    time.sleep(0.2)
    assert "recv ok" not in workers[1].lines(), workers[1].lines()  # its synchronize waits at the gate
    for r in on_all([w.pid for w in workers], "unlock", "ITEM", env=env):
        assert r.returncode == 0, r.stderr
    (short_dir / "root.info.end").touch()
    outputs = ranks.wait_all()
    assert "recv ok" in outputs[1] and outputs[0][-1] == "done", outputs


def test_a_send_that_a_queued_recv_waits_for_passes_and_the_lock_completes(daemons, ranks,
                                                                           short_dir: Path) -> None:
    """The other way round: rank 1's Recv is queued (its synchronize waits) when the locks come, and
    rank 0 issues the Send only then: the Send passes its gate, and both locks complete."""
    env, workers = _start(ranks, daemons, short_dir, mode="recvfirst")
    go = go_once_locking(workers, short_dir / "root.info.go")
    done = on_all([w.pid for w in workers], "lock", "ITEM", "--timeout", "60", env=env)
    go.join(timeout=60)
    for w, r in zip(workers, done):
        assert r.returncode == 0, (w.pid, r.returncode, r.stderr)
        status = json.loads(npusnap("status", w.pid, "--json", env=env).stdout)
        assert status["state"] == "LOCKED", status
    for r in on_all([w.pid for w in workers], "unlock", "ITEM", env=env):
        assert r.returncode == 0, r.stderr
    (short_dir / "root.info.end").touch()
    outputs = ranks.wait_all()
    assert "recv ok" in outputs[1] and "sent" in outputs[0], outputs
