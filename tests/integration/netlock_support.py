"""Live loopback TCP connections and CRIU's network lock, for the tests that check it is
undone (tests/integration/test_criu_options.py, tests/faults/test_network_lock.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Iterator

import pytest

from tests.helpers import WORKLOADS, Workload

PROG = [sys.executable, str(WORKLOADS / "criu_opts.py")]


@pytest.fixture
def peer() -> Iterator[socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    try:
        yield srv
    finally:
        srv.close()


def accept_echo(srv: socket.socket, w: Workload) -> tuple[socket.socket, object]:
    srv.settimeout(20)
    conn, _ = srv.accept()
    conn.settimeout(20)
    f = conn.makefile("rwb", buffering=0)
    assert f.readline() == b"ready\n"
    f.write(b"one\n")
    assert f.readline() == b"echo one\n"
    return conn, f


def nft_tables() -> str:
    from npusnap_cli import netlock

    lib = netlock._nft_lib()
    assert lib is not None
    import ctypes

    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    ctx = lib.nft_ctx_new(0)
    try:
        lib.nft_ctx_buffer_output(ctx)
        assert lib.nft_run_cmd_from_buffer(ctx, b"list tables") == 0
        return (lib.nft_ctx_get_output_buffer(ctx) or b"").decode()
    finally:
        lib.nft_ctx_free(ctx)


def criu_iptables_rules(port: int) -> list[str]:
    """CRIU's DROP rules (matching packets without its mark, 0xc114) for connections to our
    peer's port: the tables are the machine's, and another CRIU may lock its own meanwhile."""
    out = []
    for tool in ("iptables-save", "ip6tables-save"):
        r = subprocess.run([tool], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        out += [line for line in r.stdout.splitlines()
                if "0xc114" in line and (f"--sport {port} " in line or f"--dport {port} " in line)]
    return out


@pytest.fixture
def iptables(peer: socket.socket) -> int:
    """The peer's port, once the iptables lock is known to work here."""
    from npusnap_cli.netlock import methods
    from npusnap_cli.platform.criu import find_criu

    m = next(m for m in methods(find_criu().path) if m.name == "iptables")
    if not m.works:
        pytest.skip(f"{m.detail} (scripts/install-build-deps.sh installs iptables)")
    port = int(peer.getsockname()[1])
    assert not criu_iptables_rules(port)
    return port
