"""Another user on the machine can reach a daemon's HCCL port (TCP) but can neither join a
communicator nor inject data: a join must present the communicator's random secret, which only
the processes holding the root info know (here it sits in a 0700 directory of ours). The attack
runs as a real second user (tests/users.py) while rank 0 waits for its peer: the attacker tries
to take rank 1 with the communicator's id but a guessed secret, and to send a collective's frame
without joining; both are refused, the daemon logs the refusal, and the real rank 1 then joins
and every result is right."""

from __future__ import annotations

import encodings.idna  # noqa: F401  (imported here: the dropped child cannot read the interpreter's files)
import json
import os
import select
import socket
import struct
import time
from pathlib import Path

from tests.users import as_user, other_user

JOIN = struct.Struct("<IIIIQq32s")  # hccl_wire.h JoinMsg
JOIN_MAGIC, FRAME_MAGIC = 0x4E50484A, 0x4E504846
HCCL_E_NOT_FOUND = 6


def _root_info(path: Path) -> tuple[int, int]:
    """(port, communicator id) from rank 0's HcclRootInfo (hccl_wire.h RootBlob)."""
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline, "rank 0 wrote no root info"
        time.sleep(0.02)
    blob = path.read_bytes()
    assert blob[:8] == b"NPSHCCL1"
    (port,) = struct.unpack_from("<H", blob, 12)
    (comm_id,) = struct.unpack_from("<Q", blob, 16)
    return port, comm_id


def _connect(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def _attack(port: int, comm_id: int) -> dict:
    out = {}
    for name, secret in (("zero secret", bytes(32)), ("random secret", os.urandom(32))):
        with _connect(port) as s:
            s.sendall(JOIN.pack(JOIN_MAGIC, 1, 2, 0, comm_id, 1000, secret))
            code = struct.unpack("<iI", s.recv(8))[0]
            out[name] = (code, s.recv(1) == b"")  # the refusal, then the root hangs up
    with _connect(port) as s:
        # A collective's step of rank 1 without any join: 16 bytes of "data" (as long as a join).
        s.sendall(struct.pack("<IIQQIIIIQ", FRAME_MAGIC, 1, 1, 4, 2, 0, 0, 0, 16) + b"\xff" * 16)
        s.shutdown(socket.SHUT_WR)
        out["frame answer bytes"] = len(s.recv(64))
    return out


def test_second_user_cannot_join_or_inject(daemons, ranks, short_dir) -> None:
    (daemon,) = daemons(1)
    info = short_dir / "root.info"
    ranks.start("all", 0, 2, daemon, str(info))
    port, comm_id = _root_info(info)

    got = as_user(other_user(), _attack, port, comm_id)
    assert got["zero secret"] == [HCCL_E_NOT_FOUND, True], got
    assert got["random secret"] == [HCCL_E_NOT_FOUND, True], got
    assert got["frame answer bytes"] == 0, got  # closed without an answer

    proc = daemon.proc
    assert proc is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], 10)
    assert ready
    line = proc.stderr.readline()
    assert f"refused a join to HCCL communicator {comm_id:016x}" in line and "wrong secret" in line, line

    ranks.start("all", 1, 2, daemon, str(info))
    for rank, lines in enumerate(ranks.wait_all()):
        assert lines[-1].startswith(f"ok rank {rank} checks "), lines[-5:]
        assert not json.loads(next(x for x in lines if x.startswith("info "))[5:])["broken"]
