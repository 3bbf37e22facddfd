"""HCCL's failures end in errors, never hangs: a peer that never joins (HCCL_CONNECT_TIMEOUT ->
HCCL_E_TIMEOUT), a peer that never takes part (HCCL_EXEC_TIMEOUT -> the stream's synchronize
fails), a peer process killed mid-collective and a peer's daemon killed mid-collective (the task
fails at once, long before any timeout), and aclFinalize while a collective waits. Timeouts are kept short with CANN's variables."""

from __future__ import annotations

import json
import signal

import pytest

# aclrtSynchronizeStream's codes for a failed collective (acl/error_codes/rt_error_codes.h).
STREAM_SYNC_TIMEOUT = 507046
SUSPECT_REMOTE_ERROR = 507057
HCCL_E_TIMEOUT = 9


def _sync_result(lines: list[str]) -> tuple[int, dict]:
    rc = int(next(line for line in lines if line.startswith("sync rc="))[8:].split()[0])
    info = json.loads(next(line for line in lines if line.startswith("info "))[5:])
    return rc, info


def test_peer_that_never_joins_times_out(daemons, ranks, short_dir) -> None:
    (daemon,) = daemons(1)
    ranks.start("join", 0, 2, daemon, str(short_dir / "root.info"), env={"HCCL_CONNECT_TIMEOUT": "1"})
    (lines,) = ranks.wait_all()
    assert lines[-1].startswith(f"init rc={HCCL_E_TIMEOUT} "), lines
    assert any("HCCL_CONNECT_TIMEOUT" in line for line in lines), lines


def test_peer_that_never_takes_part_fails_the_stream(daemons, ranks, short_dir) -> None:
    (daemon,) = daemons(1)
    info = str(short_dir / "root.info")
    waiter = ranks.start("wait", 0, 2, daemon, info, env={"HCCL_EXEC_TIMEOUT": "1"})
    idle = ranks.start("idle", 1, 2, daemon, info)
    idle.wait_for_line("joined")
    assert waiter.proc.wait(timeout=60) == 0, waiter.lines()
    rc, state = _sync_result(waiter.lines())
    assert rc == STREAM_SYNC_TIMEOUT and state["broken"] and state["daemon_completed"] == 0, (rc, state)


def test_killed_peer_fails_the_collective(daemons, ranks, short_dir) -> None:
    (daemon,) = daemons(1)
    info = str(short_dir / "root.info")
    waiter = ranks.start("wait", 0, 2, daemon, info)  # CANN's default HCCL_EXEC_TIMEOUT: 1836 s
    idle = ranks.start("idle", 1, 2, daemon, info)
    idle.wait_for_line("joined")
    waiter.wait_for_line("queued")
    idle.proc.send_signal(signal.SIGKILL)
    assert waiter.proc.wait(timeout=60) == 0, waiter.lines()
    rc, state = _sync_result(waiter.lines())
    assert rc == SUSPECT_REMOTE_ERROR and state["broken"], (rc, state)


def test_finalize_with_a_collective_waiting_returns(daemons, ranks, short_dir) -> None:
    """aclFinalize ends the session: the collective its stream waits on is dropped, not awaited."""
    (daemon,) = daemons(1)
    info = str(short_dir / "root.info")
    leaving = ranks.start("finalize", 0, 2, daemon, info)  # CANN's default HCCL_EXEC_TIMEOUT: 1836 s
    idle = ranks.start("idle", 1, 2, daemon, info)
    idle.wait_for_line("joined")
    assert leaving.proc.wait(timeout=60) == 0, leaving.lines()
    assert leaving.lines()[-1] == "finalize rc=0", leaving.lines()


@pytest.mark.parametrize("killed", ["member", "root"])
def test_killed_peer_daemon_fails_the_collective(daemons, ranks, short_dir, killed) -> None:
    """Rank 0's daemon is the communicator's root (rank 0 asked it for the root info)."""
    d0, d1 = daemons(2)
    info = str(short_dir / "root.info")
    waiting_rank, dying = (0, d1) if killed == "member" else (1, d0)
    idle = ranks.start("idle", 1 - waiting_rank, 2, d1 if waiting_rank == 0 else d0, info)
    waiter = ranks.start("wait", waiting_rank, 2, d0 if waiting_rank == 0 else d1, info)
    idle.wait_for_line("joined")
    waiter.wait_for_line("queued")
    assert dying.proc is not None
    dying.proc.send_signal(signal.SIGKILL)
    assert waiter.proc.wait(timeout=60) == 0, waiter.lines()
    rc, state = _sync_result(waiter.lines())
    assert rc == SUSPECT_REMOTE_ERROR and state["broken"], (rc, state)
