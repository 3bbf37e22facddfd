"""`criu swrk` started as a checkpoint or restore command starts (npusnap_cli/platform/criustart.py):
the dump and the restore are served by that CRIU, which probed the kernel before their request
arrived (the CRIU patch scripts/criu-patches/0002 says so in its log); one started for a request
that never comes is killed and reaped; and it holds nothing of ours but its socket."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npusnap_cli.platform import criustart
from tests.helpers import Workload, npusnap, requires_criu

pytestmark = requires_criu

PROBED = criustart.EARLY_PROBE_LOG
LOOP = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.01)\n"


def criu_binary() -> str:
    from npusnap_cli.platform.criu import find_criu

    return find_criu().path


def test_checkpoint_and_restore_are_served_by_the_criu_started_early(tmp_path: Path) -> None:
    if not criustart.probes_early(criu_binary()):
        pytest.skip("this CRIU lacks scripts/criu-patches/0002 (run scripts/install-criu.sh)")
    w = Workload([sys.executable, "-c", LOOP], tmp_path / "out")
    try:
        w.wait_for_line("ready")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", check=True)
        w.proc.wait(timeout=10)
        assert PROBED in (tmp_path / "ck" / "logs" / "dump.log").read_text()
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        logs = list((tmp_path / "ck" / "logs").glob("restore-*/restore.log"))
        assert len(logs) == 1 and PROBED in logs[0].read_text()
        assert Path(f"/proc/{w.pid}").exists()
    finally:
        w.stop()


def held_by(pid: int) -> list[str]:
    """What pid's descriptors point at (one it closes while we look, probing the kernel, is left out)."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return held


def test_a_criu_started_early_and_never_taken_is_killed_and_reaped() -> None:
    r, wr = os.pipe()
    os.set_inheritable(wr, True)  # what a caller might leave us: CRIU must not hold it
    try:
        criustart.start(["-v", "checkpoint", "1", "--criu", criu_binary()])
        assert criustart._started is not None
        proc = criustart._started[1]
        assert os.getsid(proc.pid) == proc.pid  # a session of its own: a Ctrl-C is not its
        pipe = os.readlink(f"/proc/self/fd/{wr}")
        assert pipe not in held_by(proc.pid)
        criustart.drop()
        assert criustart._started is None and proc.returncode is not None
        assert not Path(f"/proc/{proc.pid}").exists()
    finally:
        criustart.drop()
        os.close(r)
        os.close(wr)


def test_another_binary_is_not_served_by_the_criu_started_early() -> None:
    criustart.start(["restore", "DIR"])
    try:
        if criustart._started is None:
            pytest.skip("no criu on PATH (the request finds its own)")
        proc = criustart._started[1]
        assert criustart.take("/bin/true") is None  # another binary: that CRIU is dropped
        assert criustart._started is None and proc.returncode is not None
    finally:
        criustart.drop()


@pytest.mark.parametrize("argv", [["list", "DIR"], ["checkpoint", "--help"], ["--config", "restore", "inspect"],
                                  ["job", "checkpoint"], []])
def test_no_criu_is_started_for_other_commands(argv: list[str]) -> None:
    criustart.start(argv)
    try:
        assert criustart._started is None
    finally:
        criustart.drop()


def test_no_criu_is_started_onto_our_standard_descriptors(tmp_path: Path) -> None:
    """Started with stdin, stdout and stderr closed, the socket for CRIU would be one of them, which
    its /dev/null would replace: none is started then (the request starts its own, as before)."""
    out = tmp_path / "out"
    code = ("import os\nfor fd in (0, 1, 2): os.close(fd)\n"
            "from npusnap_cli.platform import criustart\n"
            "criustart.start(['checkpoint', '1'])\n"
            f"open({str(out)!r}, 'w').write(repr(criustart._started))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert out.read_text() == "None"


def test_a_lazy_pages_socket_counts_as_ready_once_it_listens(tmp_path: Path) -> None:
    """A restore whose CRIU probed ahead connects to `criu lazy-pages` within moments of its socket
    file appearing: bind() makes the file, only listen() lets a connect in (refused before)."""
    import socket

    from npusnap_cli.platform.criu import LAZY_SOCKET, _listening

    cwd = os.getcwd()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(tmp_path)
        s.bind(LAZY_SOCKET)  # as CRIU binds it: a name relative to its work directory
        assert (tmp_path / LAZY_SOCKET).exists() and not _listening(os.getpid(), LAZY_SOCKET)
        s.listen(1)
        assert _listening(os.getpid(), LAZY_SOCKET)
        assert not _listening(os.getpid(), "another.socket")
    finally:
        os.chdir(cwd)
        s.close()
