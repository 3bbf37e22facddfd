"""The job layer's pieces that need no cluster: the wire's authentication (a wrong secret, a
replay, another run, garbage), the secret file's mode, and the restore's placement and shape
refusal."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from npusnap_cli.core.job.coordinator import placement
from npusnap_cli.core.job.manifest import JobManifest, NodeEntry, RankEntry
from npusnap_cli.core.job.protocol import Channel, ProtocolError, new_secret, read_secret
from npusnap_cli.errors import PermissionProblem, WrongState

KEY = bytes(range(32))


def pair(key_a: bytes = KEY, key_b: bytes = KEY, run_a: str = "r1", run_b: str = "r1") -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    return Channel(a, key_a, run_a), Channel(b, key_b, run_b)


def test_a_signed_message_arrives_in_order() -> None:
    a, b = pair()
    try:
        a.send("hello", node="n1")
        a.send("prepared", node="n1")
        assert b.receive(timeout=5)["type"] == "hello"
        got = b.receive(timeout=5)
        assert (got["type"], got["node"], got["seq"]) == ("prepared", "n1", 2)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("case", ["wrong key", "other run", "replay", "garbage", "closed", "silence"])
def test_a_bad_message_is_refused(case: str) -> None:
    a, b = pair(key_a=bytes(32) if case == "wrong key" else KEY, run_a="r2" if case == "other run" else "r1")
    try:
        if case == "replay":
            a.send("hello")
            assert b.receive(timeout=5)["type"] == "hello"
            a.sent = 0  # the same line again
            a.send("hello")
        elif case == "garbage":
            a.sock.sendall(b'{"body": 1}\n')
        elif case == "closed":
            a.close()
        elif case != "silence":
            a.send("hello")
        with pytest.raises(ProtocolError):
            b.receive(timeout=0.5)
    finally:
        a.close()
        b.close()


def test_the_secret_file_is_private_and_checked(tmp_path: Path) -> None:
    key = new_secret(tmp_path / "secret")
    assert len(key) == 32 and (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert read_secret(tmp_path / "secret") == key
    with pytest.raises(FileExistsError):
        new_secret(tmp_path / "secret")  # never replaced
    os.chmod(tmp_path / "secret", 0o644)
    with pytest.raises(PermissionProblem, match="readable by others"):
        read_secret(tmp_path / "secret")
    with pytest.raises(PermissionProblem):
        read_secret(tmp_path / "absent")


def _manifest(per_node: dict[str, int]) -> JobManifest:
    nodes, ranks = [], []
    for name, count in per_node.items():
        nodes.append(NodeEntry(name=name, address="", dir=f"nodes/{name}", manifest_sha256=""))
        for _ in range(count):
            ranks.append(RankEntry(rank=len(ranks), step=0, procid=len(ranks), node=name, pid=100 + len(ranks),
                                   images=""))
    return JobManifest(slurm_job_id="1", created="", npusnap_version="", nodes=nodes, ranks=ranks)


def test_placement_by_rank_order_and_the_shape_refused() -> None:
    m = _manifest({"a": 2, "b": 2})
    assert placement(m, ["x", "y"], None) == {"a": "x", "b": "y"}
    assert placement(m, ["x", "y"], ["y", "x"]) == {"a": "y", "b": "x"}
    with pytest.raises(WrongState, match=r"4 ranks on 2 nodes \(2/2 per node\); the new allocation has 3"):
        placement(m, ["x", "y", "z"], None)
    with pytest.raises(WrongState, match="are not the job's nodes"):
        placement(m, ["x", "y"], ["x", "q"])
