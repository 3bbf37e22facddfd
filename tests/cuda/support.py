"""Plumbing for the cuda backend's end-to-end tests against the test shim (native/cudashim)."""

from __future__ import annotations

import sys
from typing import Optional

from npusnap_cli import native
from tests.helpers import WORKLOADS
from tests.pipeline.support import strip_ready  # noqa: F401  (re-exported)

SHIM = native.NATIVE_DIR / "testing" / "libcuda.so.1"


def sim_uuid(index: int) -> str:
    """The shim's UUID for npusim device `index`."""
    return f"GPU-4e505553-494d-0000-0000-{index:012x}"


def workload_argv(steps: int, sleep_ms: int, heavy: int = 0) -> list[str]:
    """tests/workloads/npusim_steps.py: no agent, only the runtime (whose control listener serves the shim)."""
    return [sys.executable, str(WORKLOADS / "npusim_steps.py"), str(steps), str(sleep_ms), str(heavy)]





def shim_env(base: dict[str, str], **extra: Optional[str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != "LD_PRELOAD"}
    env["NPUSNAP_LIBCUDA"] = str(SHIM)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
