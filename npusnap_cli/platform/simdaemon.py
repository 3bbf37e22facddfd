"""Lifecycle of the npusim device daemon: start (idempotent), stop, status.

Used by `npusnap device`, the demo, and the tests."""

from __future__ import annotations

import os
import select
import signal
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from .. import native
from ..errors import DeviceFailed, EnvironmentProblem, PermissionProblem
from .procfs import wait_gone


def socket_path(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get("NPUSIM_SOCKET") or native.DEFAULT_NPUSIM_SOCKET


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        value = int(float(num) * units[unit])
    except (ValueError, OverflowError):  # nan, inf, 1e308G
        raise ValueError(f"not a size: {text!r} (try 4G, 512M)") from None
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def dir_problem(directory: str, owner: int) -> Optional[str]:
    """Why a socket directory cannot be trusted (None if it can): it must be a real directory
    owned by root or owner and writable by neither group nor others, so nobody else can plant or
    swap the socket or the log in it (the rule of native/npusim/trust.h)."""
    try:
        st = os.lstat(directory)
    except OSError as e:
        return f"{directory}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory (a link?)"
    if st.st_uid not in (0, owner):
        return f"{directory} belongs to uid {st.st_uid}, not to root or uid {owner}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{directory} is writable by group or others: anyone could plant the socket there"
    return None


def check_dir(directory: str, owner: int) -> None:
    problem = dir_problem(directory, owner)
    if problem is not None:
        raise PermissionProblem(f"refusing the npusim socket directory: {problem}",
                                "remove it, or choose a socket in a directory only you (or root) can write")


def daemon_peer(sock: str) -> Optional[tuple[int, int]]:
    """(pid, uid) of the process that listens on sock, from the kernel (SO_PEERCRED: as of its
    listen(), so the pid may be a launcher that forked the daemon), not from anything it says;
    None when nothing answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(sock)
            pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return None
    return pid, uid


def status(sock: str) -> Optional[dict[str, Any]]:
    """The daemon's status, or None when no daemon answers on sock. Only a daemon we trust
    is asked: run by root or by us, or (when we are root) by the owner of its socket's
    directory, which check_dir vouches for. Anyone else's could report whatever it likes."""
    if not os.path.exists(sock):
        return None
    peer = daemon_peer(sock)
    if peer is None:
        return None
    trusted = {0, os.geteuid()}
    if os.geteuid() == 0:
        try:
            trusted.add(os.stat(os.path.dirname(os.path.abspath(sock))).st_uid)
        except OSError:
            pass
    if peer[1] not in trusted:
        raise PermissionProblem(f"the npusim daemon on {sock} runs as uid {peer[1]}, neither root nor you: "
                                "not asked", "use a daemon run by root or by yourself")
    import npusim

    try:
        return dict(npusim.daemon_status(sock))
    except Exception:
        return None


def _open_log(directory: str, name: str) -> int:
    """The daemon's log, inside the checked directory, never through a link."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        check_dir(f"/proc/self/fd/{dfd}/.", os.geteuid())  # the directory opened is the one checked
        return os.open(name, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError as e:
        raise PermissionProblem(f"cannot open the npusim log {directory}/{name}: {e.strerror}",
                                "remove what is in its place") from None
    finally:
        os.close(dfd)


def check_hccl_listen(spec: str) -> None:
    """ValueError unless spec is npusimd's --hccl-listen IPv4[:PORT]."""
    import ipaddress

    addr, colon, port = spec.partition(":")
    try:
        ipaddress.IPv4Address(addr)
    except ValueError:
        raise ValueError(f"want IPv4[:PORT], not {spec!r}") from None
    if colon and not (port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"the port of {spec!r} is not 1-65535")


def start(sock: str, devices: int = 2, memory: int = 4 << 30, timeout: float = 10,
          group: Optional[str] = None, hccl_listen: Optional[str] = None) -> tuple[int, bool]:
    """Start a daemon on sock unless one answers there; returns (pid, started_now). With group, the
    daemon serves that group's members too (socket 0660 owner:group). hccl_listen: IPv4[:PORT]
    where it takes other daemons' HCCL traffic (the node's address when ranks span hosts)."""
    directory = os.path.dirname(os.path.abspath(sock))
    if os.path.lexists(directory):
        check_dir(directory, os.geteuid())  # before anything talks to or writes in it
    current = status(sock)
    if current is not None:
        return int(current.get("pid", 0)), False
    if not native.NPUSIMD.exists():
        raise EnvironmentProblem(f"npusimd missing at {native.NPUSIMD}", "reinstall npusnap (pip install .)")
    Path(directory).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o755)  # group members must reach the socket
    except FileExistsError:
        pass
    check_dir(directory, os.geteuid())
    log = _open_log(directory, Path(sock).with_suffix(".log").name)
    cmd = [str(native.NPUSIMD), "--socket", sock, "--devices", str(devices), "--memory", str(memory)]
    if group:
        cmd += ["--group", group]
    if hccl_listen:
        cmd += ["--hccl-listen", hccl_listen]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except BaseException:
        os.close(log)
        raise
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline and not line.endswith(b"\n"):
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                break
            line += chunk
    proc.stdout.close()
    if not line.startswith(b"ready"):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        size = os.fstat(log).st_size
        text = os.pread(log, 4096, max(0, size - 4096)).decode(errors="replace")
        os.close(log)
        tail = text.strip().splitlines()[-1:]
        raise DeviceFailed(f"npusim daemon did not start on {sock}: {' '.join(tail) or 'no output'}")
    os.close(log)
    proc.wait(timeout=timeout)  # the launcher exits once the daemon it forked is ready
    return int(line.split()[1]), True


def stop(sock: str, timeout: float = 10) -> Optional[int]:
    """Stop the daemon on sock; returns its pid, or None if none was running."""
    peer = daemon_peer(sock)
    current = status(sock)
    if peer is None or current is None:
        return None
    _, uid = peer  # the listener's uid, from the kernel (its pid is the launcher that called listen)
    pid = int(current["pid"])
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return pid
    if owner != uid:  # a reply's pid could name anyone's process
        raise PermissionProblem(f"the npusim daemon on {sock} (uid {uid}) names process {pid} of uid {owner}")
    if uid not in (0, os.geteuid()) and os.geteuid() != 0:
        raise PermissionProblem(f"the npusim daemon on {sock} belongs to uid {uid}")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid
    if wait_gone([pid], timeout=timeout, zombies_count=False):
        os.kill(pid, signal.SIGKILL)
    return pid


def shell_env(sock: str) -> dict[str, str]:
    """What CANN's set_env.sh would export, for the simulated toolkit."""
    home = str(native.TOOLKIT_HOME)
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    lib = f"{home}/lib64"
    return {
        "ASCEND_TOOLKIT_HOME": home,
        # CANN's samples find the toolkit through these (their run.sh, CMake and set_sample_env.sh).
        "ASCEND_HOME_PATH": home,
        "ASCEND_INSTALL_PATH": home,
        "LD_LIBRARY_PATH": lib if not ld else (ld if lib in ld.split(":") else f"{lib}:{ld}"),
        "NPUSIM_SOCKET": sock,
    }
