"""Where the native pieces built by CMake live inside the installed package."""

from __future__ import annotations

from pathlib import Path


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

DEFAULT_NPUSIM_SOCKET = "/tmp/npusim/daemon.sock"


def agent_socket_name(pid: int) -> str:
    """The agent's abstract Unix socket name (leading NUL included)."""
    return f"\0npusnap-agent-{pid}"
