"""Where the native pieces built by CMake live inside the installed package."""

from __future__ import annotations

import os
from pathlib import Path

from ._protocol import AGENT_SOCKET_PREFIX


def _native_dir() -> Path:
    """The built native parts: beside this file once installed. Run from a source
    checkout (tests, `python -m npusnap_cli`), fall back to the installed copy."""
    here = Path(__file__).resolve().parent / "_native"
    if here.exists():
        return here
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("npusnap").locate_file("npusnap_cli/_native")))
    except (ImportError, PackageNotFoundError):
        return here
    return installed if installed.exists() else here


NATIVE_DIR = _native_dir()
TOOLKIT_HOME = NATIVE_DIR / "toolkit"  # a CANN-shaped ASCEND_TOOLKIT_HOME
NPUSIMD = NATIVE_DIR / "bin" / "npusimd"
INJECTOR = NATIVE_DIR / "bin" / "npusnap-inject"
AGENT_LIB = NATIVE_DIR / "lib" / "libnpusnap_agent.so"
RUNTIME_LIB = TOOLKIT_HOME / "lib64" / "libascendcl.so"



def default_npusim_socket() -> str:
    """The npusim socket when NPUSIM_SOCKET is unset, by the rule the runtime and npusimd use
    (native/npusim/trust.h): root's under /run, a user's under $XDG_RUNTIME_DIR, else a
    per-uid directory in /tmp that is refused unless it is the user's own."""
    if os.geteuid() == 0:
        return "/run/npusim/daemon.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        return f"{xdg}/npusim/daemon.sock"
    return f"/tmp/npusim-{os.geteuid()}/daemon.sock"


DEFAULT_NPUSIM_SOCKET = default_npusim_socket()


def agent_socket_name(pid: int) -> str:
    """The agent's abstract Unix socket name (leading NUL included)."""
    return f"\0{AGENT_SOCKET_PREFIX}{pid}"
