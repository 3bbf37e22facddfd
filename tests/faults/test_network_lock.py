"""The network lock CRIU holds on a dumped tree's TCP connections is undone on every
failure: a checkpoint rolled back after CRIU's dump (CRIU keeps its lock for a tree it
leaves stopped), and one CRIU itself refuses. Each ends with the connection alive and
none of CRIU's rules left (iptables, tested for real; nftables in
tests/integration/test_criu_options.py)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from tests.helpers import Workload, npusnap, pid_alive, proc_state, requires_criu
from tests.integration.netlock_support import (
    PROG,
    accept_echo,
    criu_iptables_rules,
)
from tests.pipeline.support import assert_no_checkpoint

from .support import PausedCli, one_error_line

pytestmark = requires_criu


def test_iptables_lock_is_undone_when_the_checkpoint_fails_after_the_dump(iptables: int, peer: socket.socket,
                                                                          tmp_path: Path) -> None:
    port = iptables
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    cli = None
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            cli = PausedCli(["checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--tcp-established",
                             "--network-lock", "iptables"], "after:dump", dict(os.environ))
            assert criu_iptables_rules(port)  # CRIU locked the connection, and keeps it locked for a restore
            cli.proc.send_signal(signal.SIGINT)  # after a successful dump: everything is rolled back
            assert cli.proc.wait(timeout=60) == 130
            assert_no_checkpoint(tmp_path / "ck")
            assert pid_alive(w.pid) and proc_state(w.pid) != "T"
            assert not criu_iptables_rules(port)
            f.write(b"two\n")
            assert f.readline() == b"echo two\n"
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        w.stop()
    assert not criu_iptables_rules(port)


def test_iptables_lock_is_gone_when_criu_fails(iptables: int, peer: socket.socket, tmp_path: Path) -> None:
    # A connection CRIU must not dump (no --tcp-established): CRIU fails; nothing of its lock stays.
    port = iptables
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--network-lock", "iptables")
            assert r.returncode == 7 and "--tcp-established" in one_error_line(r.stderr), r.stderr
            assert_no_checkpoint(tmp_path / "ck")
            assert not criu_iptables_rules(port)
            f.write(b"two\n")
            assert f.readline() == b"echo two\n"
    finally:
        w.stop()
