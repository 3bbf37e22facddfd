"""Who may use the software NPU, and with whose rights: every attack of issue 12 on the device
daemon, run as a real second user against a real root daemon.

Against main's build (socket 0755, files opened by the daemon as root, /tmp/npusim) each test
fails: a group member cannot connect at all; the non-member gets 507899 instead of a refusal;
the export/import cases were checked by hand with main's npusimd and its socket chmodded 0666
(the issue's "once opened to them"): the root daemon created dev0.img in a root-only directory,
truncated root's dev0.img, and answered the import with root's allocation address; status listed
every client and Shutdown obeyed anyone; `device start` followed the planted daemon.log; and a
fake daemon was trusted by both the runtime and the native client.
"""

from __future__ import annotations

import errno
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import npusim
import numpy as np  # imported here: the dropped child cannot read the interpreter's files
import pytest

from npusnap_cli import native
from npusnap_cli.errors import PermissionProblem
from npusnap_cli.platform import simimages
from tests.helpers import npusnap
from tests.users import as_user, device_user, other_user, popen_as

from ..direct.support import Client

NO_PERMISSION = 207006  # ACL_ERROR_RT_NO_PERMISSION
MiB = 1 << 20


def _shared(parent: Path, name: str) -> Path:
    """A sticky world-writable directory, like /tmp."""
    d = parent / name
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


# What the unprivileged users run (in a fork of this process, after dropping to the user).

def _init(sock: str) -> None:
    os.environ["NPUSIM_SOCKET"] = sock
    npusim.init()
    npusim.set_device(0)


def _round_trip(sock: str) -> bool:
    _init(sock)
    addr = npusim.malloc(MiB)
    data = (np.arange(MiB) % 251).astype(np.uint8)
    npusim.memcpy_h2d(addr, data)
    back = np.empty(MiB, np.uint8)
    npusim.memcpy_d2h(back, addr)
    return bool((back == data).all())


def _init_code(sock: str) -> int:
    try:
        _init(sock)
    except npusim.AclError as e:
        return int(e.code)
    return 0


def _outcome(fn: Any, *args: Any) -> str:
    try:
        fn(*args)
    except OSError as e:
        return f"errno {errno.errorcode.get(e.errno or 0, e.errno)}: {e}"
    except npusim.AclError as e:
        return f"acl {e.code}: {e}"
    return "done"


def _locked_export(sock: str, directory: str) -> str:
    """Lock our own process and ask the daemon to export it into directory."""
    _init(sock)
    npusim.memset(npusim.malloc(MiB), 7, MiB)
    npusim.snapshot_lock()
    return _outcome(npusim.export_client, sock, os.getpid(), directory)


def _locked_import(sock: str, directory: str) -> str:
    _init(sock)
    npusim.malloc(MiB)
    npusim.snapshot_lock()
    return _outcome(npusim.import_client, sock, os.getpid(), directory, None)


def _export_other(sock: str, pid: int, directory: str) -> str:
    return _outcome(npusim.export_client, sock, pid, directory)


def _status(sock: str) -> dict[str, Any]:
    return dict(npusim.daemon_status(sock))


def _shutdown(sock: str) -> str:
    return _outcome(npusim.daemon_shutdown, sock)


# ------------------------------------------------------------------------------ who may connect

def test_group_member_uses_the_device(group_daemon) -> None:
    assert as_user(device_user(), _round_trip, group_daemon.socket) is True
    assert oct(os.stat(group_daemon.socket).st_mode & 0o777) == "0o660"


def test_non_member_is_refused_with_a_cann_code_and_a_logged_reason(group_daemon) -> None:
    mallory = other_user()
    assert as_user(mallory, _init_code, group_daemon.socket) == NO_PERMISSION  # the socket's mode
    os.chmod(group_daemon.socket, 0o666)  # opened by mistake: the daemon still refuses, and says why
    assert as_user(mallory, _init_code, group_daemon.socket) == NO_PERMISSION
    proc = group_daemon.proc
    assert proc is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], 10)
    assert ready
    line = proc.stderr.readline()
    assert f"refused uid {mallory.uid}" in line and "npusim-users" in line, line


def test_without_group_only_owner_and_root(npusim_daemon) -> None:
    directory = os.path.dirname(npusim_daemon.socket)
    os.chmod(directory, 0o755)  # reachable: the daemon itself must refuse
    assert oct(os.stat(npusim_daemon.socket).st_mode & 0o777) == "0o600"
    os.chmod(npusim_daemon.socket, 0o666)  # even a socket opened by mistake
    assert as_user(device_user(), _init_code, npusim_daemon.socket) == NO_PERMISSION


# ------------------------------------------------------------------- files with the caller's rights

def test_export_into_a_root_only_directory_is_impossible(group_daemon, scratch) -> None:
    etc = scratch / "etc"  # stands for /etc, /root: root's, not writable by the user
    etc.mkdir(mode=0o755)
    out = as_user(device_user(), _locked_export, group_daemon.socket, str(etc))
    assert out.startswith("errno EACCES"), out
    assert list(etc.iterdir()) == []


def test_export_over_a_root_checkpoint_image_is_impossible(group_daemon, scratch) -> None:
    shared = _shared(scratch, "shared")
    victim = shared / "dev0.img"
    victim.write_bytes(b"root's device image")
    os.chmod(victim, 0o600)
    out = as_user(device_user(), _locked_export, group_daemon.socket, str(shared))
    assert out.startswith("errno EEXIST"), out  # O_EXCL: never into a file that exists
    assert victim.read_bytes() == b"root's device image"


def test_export_into_own_directory_works_and_is_private(group_daemon, scratch) -> None:
    shared = _shared(scratch, "shared")
    mine = shared / "mine"
    alice = device_user()
    mine.mkdir()
    os.chown(mine, alice.uid, alice.gid)
    assert as_user(alice, _locked_export, group_daemon.socket, str(mine)) == "done"
    img = mine / "dev0.img"
    assert img.stat().st_uid == alice.uid and img.stat().st_mode & 0o777 == 0o600


def test_import_of_a_root_only_checkpoint_is_impossible(group_daemon, scratch) -> None:
    ck = scratch / "ck"
    ck.mkdir(mode=0o700)
    root_client = Client(group_daemon.env)
    try:
        addr = root_client.call("alloc", 0, MiB, "random", 3)
        root_client.call("lock")
        npusim.export_client(group_daemon.socket, root_client.pid, ck)
        out = as_user(device_user(), _locked_import, group_daemon.socket, str(ck))
        assert out.startswith("errno EACCES"), out
        assert hex(addr) not in out and str(MiB) not in out
        # Naming root's process is refused, and the refusal names none of its allocations.
        out = as_user(device_user(), _export_other, group_daemon.socket, root_client.pid, str(scratch))
        assert "permission denied" in out and hex(addr) not in out, out
    finally:
        root_client.close()


# ---------------------------------------------------------------------------- admin requests

def test_status_hides_clients_and_shutdown_refused_for_others(group_daemon) -> None:
    root_client = Client(group_daemon.env)
    try:
        root_client.call("alloc", 0, MiB, "zero", 0)
        mine = _status(group_daemon.socket)
        assert [c["pid"] for c in mine["clients"]] == [root_client.pid]
        theirs = as_user(device_user(), _status, group_daemon.socket)
        assert "clients" not in theirs and theirs["pid"] == mine["pid"] and theirs["devices"]
        assert str(root_client.pid) not in json.dumps(theirs)
        out = as_user(device_user(), _shutdown, group_daemon.socket)
        assert out.startswith(f"acl {NO_PERMISSION}"), out
        assert group_daemon.proc is not None and group_daemon.proc.poll() is None
        assert _status(group_daemon.socket)["pid"] == mine["pid"]
    finally:
        root_client.close()


# ------------------------------------------------------------------------- planted directories

def _as_mallory_plant(directory: str, link_to: str) -> None:
    os.mkdir(directory)
    os.chmod(directory, 0o777)
    os.symlink(link_to, os.path.join(directory, "daemon.log"))


def test_planted_socket_dir_with_a_linked_log_is_refused(scratch) -> None:
    tmp = _shared(scratch, "tmp")  # like /tmp
    precious = scratch / "precious"
    precious.write_text("keep\n")
    planted = tmp / "npusim"
    as_user(other_user(), _as_mallory_plant, str(planted), str(precious))
    sock = str(planted / "daemon.sock")
    try:
        r = npusnap("device", "start", "--socket", sock, "--devices", "1", "--memory", "16M")
        assert r.returncode == PermissionProblem.exit_code, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "belongs to uid" in lines[0] and "Traceback" not in r.stderr
        assert precious.read_text() == "keep\n"
        assert not os.path.exists(sock)
    finally:
        npusnap("device", "stop", "--socket", sock)  # on old code it started one


def test_socket_dir_owned_by_someone_else_is_refused_by_the_runtime(scratch) -> None:
    tmp = _shared(scratch, "tmp")
    planted = tmp / "npusim"
    as_user(other_user(), _as_mallory_plant, str(planted), "/nonexistent")
    os.chmod(planted, 0o755)  # even when not writable by others: it is not root's
    code = r"""
import npusim, sys
try:
    npusim.init()
except npusim.AclError as e:
    sys.exit(e.code % 256 if e.code == 207006 else 1)
"""
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NPUSIM_SOCKET": str(planted / "daemon.sock")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == NO_PERMISSION % 256, r.stderr
    assert "refusing the socket" in r.stderr and "belongs to uid" in r.stderr


# ------------------------------------------------------------------------------- fake daemons

@pytest.fixture
def fake_daemon(scratch) -> Iterator[str]:
    """A real npusimd run by the attacker, its socket in a directory root owns (0755) by the end:
    only the SO_PEERCRED checks can tell it apart from a real device."""
    mallory = other_user()
    d = scratch / "fake"
    d.mkdir(mode=0o755)
    os.chown(d, mallory.uid, mallory.gid)
    os.chmod(native.NPUSIMD.parent, 0o755)
    sock = str(d / "daemon.sock")
    proc = popen_as(mallory, [str(native.NPUSIMD), "--socket", sock, "--devices", "1", "--memory", "16M",
                              "--foreground"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready and proc.stdout.readline().startswith("ready"), proc.stderr.read() if proc.stderr else ""
        os.chmod(sock, 0o666)  # mallory's daemon serves anyone
        os.chown(d, 0, 0)
        yield sock
    finally:
        proc.kill()
        proc.wait()
        for s in (proc.stdout, proc.stderr):
            if s is not None:
                s.close()


def test_fake_daemon_refused_by_a_root_workload(fake_daemon) -> None:
    code = r"""
import npusim, sys
try:
    npusim.init()
except npusim.AclError as e:
    print(e.code)
    sys.exit(0)
print("connected")
"""
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NPUSIM_SOCKET": fake_daemon},
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == str(NO_PERMISSION), (r.stdout, r.stderr)
    assert "neither root nor us" in r.stderr


def test_fake_daemon_refused_by_the_root_cli(fake_daemon, scratch) -> None:
    out = scratch / "out"
    out.mkdir(mode=0o700)
    with pytest.raises(npusim.AclError, match="not trusted") as ei:
        npusim.export_client(fake_daemon, os.getpid(), out)
    assert ei.value.code == NO_PERMISSION
    assert list(out.iterdir()) == []


def test_fake_daemon_is_not_asked_for_status_by_the_root_cli(fake_daemon) -> None:
    """A daemon run by another user in a root-owned directory could report any devices and free
    memory (device status, restore's pre-check): the CLI asks only a daemon it trusts."""
    r = npusnap("device", "status", "--socket", fake_daemon, "--json", timeout=60)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "not asked" in r.stderr and r.stdout.strip() == ""


def test_root_cli_refuses_a_socket_the_target_names_in_an_untrusted_directory(scratch) -> None:
    tmp = _shared(scratch, "tmp")
    planted = tmp / "npusim"
    as_user(other_user(), _as_mallory_plant, str(planted), "/nonexistent")
    target = subprocess.Popen(["/bin/sh", "-c", "echo ready; exec sleep 60"], stdout=subprocess.PIPE, text=True,
                              env={"NPUSIM_SOCKET": str(planted / "daemon.sock")})
    try:
        assert target.stdout is not None and target.stdout.readline() == "ready\n"
        # Read its environment once the exec is over, not mid-way: the kernel renames the process
        # before it lays out the new environment (an empty environ in between names no socket).
        deadline = time.monotonic() + 10
        while (Path(f"/proc/{target.pid}/comm").read_text().strip() != "sleep"
               or b"NPUSIM_SOCKET=" not in Path(f"/proc/{target.pid}/environ").read_bytes()) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(PermissionProblem, match="cannot be trusted"):
            simimages.daemon_socket(target.pid)
    finally:
        target.kill()
        target.wait()
        if target.stdout is not None:
            target.stdout.close()


def test_device_start_with_group_serves_members(scratch) -> None:
    sock = str(scratch / "dev" / "daemon.sock")
    try:
        r = npusnap("device", "start", "--socket", sock, "--devices", "1", "--memory", "16M",
                    "--group", "npusim-users")
        assert r.returncode == 0, r.stderr
        assert as_user(device_user(), _round_trip, sock) is True
        assert as_user(other_user(), _init_code, sock) == NO_PERMISSION
        log = scratch / "dev" / "daemon.log"
        assert log.stat().st_mode & 0o777 == 0o600 and not log.is_symlink()
    finally:
        stop = npusnap("device", "stop", "--socket", sock)
        assert stop.returncode == 0, stop.stderr
    assert not os.path.exists(sock)
