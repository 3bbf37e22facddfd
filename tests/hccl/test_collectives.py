"""HCCL collectives across rank processes (tests/hccl/hccl_ranks.c): every collective, every data
type and reduce op against a CPU reference computed in the rank program, Send/Recv in a ring,
Barrier, and a kernel, an AllReduce and a copy ordered on one stream; ranks on one daemon (a
device each), on two daemons talking over loopback, and joined through a rank table file."""

from __future__ import annotations

import json

import pytest

from .conftest import free_port

# What hccl_ranks' "all" mode issues: 12 types x (4 ops x 3 reducing collectives + AllGather +
# Broadcast), Barrier, the stream-order AllReduce (Send/Recv do not count).
COLLECTIVES = 12 * (4 * 3 + 2) + 2


def _check_all(outputs: list[list[str]], nranks: int) -> None:
    comms = set()
    for rank, lines in enumerate(outputs):
        assert lines[-1].startswith(f"ok rank {rank} checks "), lines[-5:]
        info = json.loads(next(line for line in lines if line.startswith("info "))[5:])
        assert info["rank"] == rank and info["ranks"] == nranks and not info["broken"], info
        # The communicator's sequence number, in the client and in the daemon.
        assert info["seq"] == info["daemon_issued"] == info["daemon_completed"] == COLLECTIVES, info
        comms.add(info["comm"])
    assert len(comms) == 1, comms


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_collectives_between_processes_on_one_daemon(daemons, ranks, short_dir, nranks) -> None:
    (daemon,) = daemons(1)
    info = str(short_dir / "root.info")
    for r in range(nranks):
        ranks.start("all", r, nranks, daemon, info)
    _check_all(ranks.wait_all(), nranks)


def test_collectives_between_two_daemons_over_loopback(daemons, ranks, short_dir) -> None:
    d0, d1 = daemons(2)
    info = str(short_dir / "root.info")
    ranks.start("all", 0, 2, d0, info, device=0)
    ranks.start("all", 1, 2, d1, info, device=0)  # device 0 of the other daemon
    _check_all(ranks.wait_all(), 2)


def _rank_table(path, nranks: int) -> None:
    devices = [{"device_id": str(r), "device_ip": "", "rank_id": str(r)} for r in range(nranks)]
    table = {"version": "1.0", "status": "completed", "server_count": "1",
             "server_list": [{"server_id": "127.0.0.1", "device": devices}]}
    path.write_text(json.dumps(table, indent=2))


def test_rank_table_file_joins_ranks_on_two_daemons(daemons, ranks, short_dir) -> None:
    d0, d1 = daemons(2)
    table = short_dir / "rank_table.json"
    _rank_table(table, 2)
    env = {"HCCL_IF_BASE_PORT": str(free_port())}  # the root (rank 0's daemon) listens there
    ranks.start("all", 1, 2, d1, f"table:{table}", env=env)  # before the root: it retries
    ranks.start("all", 0, 2, d0, f"table:{table}", env=env)
    second, first = ranks.wait_all()
    _check_all([first, second], 2)


def test_malformed_rank_table_is_refused(daemons, ranks, short_dir) -> None:
    (daemon,) = daemons(1)
    table = short_dir / "rank_table.json"
    table.write_text('{"version": "1.0", "server_list": [{"server_id": "0", "device": [{"rank_id": "1"}]}]}')
    ranks.start("join", 0, 1, daemon, f"table:{table}")
    (lines,) = ranks.wait_all()
    assert lines[-1].startswith("init rc=1 "), lines  # HCCL_E_PARA, with the reason on stderr
    assert any("rank_id or device_id" in line for line in lines), lines
