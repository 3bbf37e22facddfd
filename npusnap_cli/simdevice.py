"""Lifecycle of the npusim device daemon: start (idempotent), stop, status.

Used by `npusnap device`, the demo, and the tests."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from . import native
from .errors import DeviceFailed, EnvironmentProblem
from .target import wait_gone


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


def status(sock: str) -> Optional[dict[str, Any]]:
    """The daemon's status, or None when no daemon answers on sock."""
    if not os.path.exists(sock):
        return None
    import npusim

    try:
        return dict(npusim.daemon_status(sock))
    except Exception:
        return None


def start(sock: str, devices: int = 2, memory: int = 4 << 30, timeout: float = 10) -> tuple[int, bool]:
    """Start a daemon on sock unless one answers there; returns (pid, started_now)."""
    current = status(sock)
    if current is not None:
        return int(current.get("pid", 0)), False
    if not native.NPUSIMD.exists():
        raise EnvironmentProblem(f"npusimd missing at {native.NPUSIMD}", "reinstall npusnap (pip install .)")
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    log = open(Path(sock).with_suffix(".log"), "ab")
    proc = subprocess.Popen(
        [str(native.NPUSIMD), "--socket", sock, "--devices", str(devices), "--memory", str(memory)],
        stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    log.close()
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
        tail = Path(sock).with_suffix(".log").read_text(errors="replace").strip().splitlines()[-1:]
        raise DeviceFailed(f"npusim daemon did not start on {sock}: {' '.join(tail) or 'no output'}")
    proc.wait(timeout=timeout)  # the launcher exits once the daemon it forked is ready
    return int(line.split()[1]), True


def stop(sock: str, timeout: float = 10) -> Optional[int]:
    """Stop the daemon on sock; returns its pid, or None if none was running."""
    current = status(sock)
    if current is None:
        return None
    pid = int(current["pid"])
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
        "LD_LIBRARY_PATH": lib if not ld else (ld if lib in ld.split(":") else f"{lib}:{ld}"),
        "NPUSIM_SOCKET": sock,
    }
