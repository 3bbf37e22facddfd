"""Where the native pieces built by CMake live inside the installed package."""

from __future__ import annotations

from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent / "_native"
TOOLKIT_HOME = NATIVE_DIR / "toolkit"  # a CANN-shaped ASCEND_TOOLKIT_HOME
NPUSIMD = NATIVE_DIR / "bin" / "npusimd"
INJECTOR = NATIVE_DIR / "bin" / "npusnap-inject"
AGENT_LIB = NATIVE_DIR / "lib" / "libnpusnap_agent.so"
RUNTIME_LIB = TOOLKIT_HOME / "lib64" / "libascendcl.so"

DEFAULT_NPUSIM_SOCKET = "/tmp/npusim/daemon.sock"


def agent_socket_name(pid: int) -> str:
    """The agent's abstract Unix socket name (leading NUL included)."""
    return f"\0npusnap-agent-{pid}"
