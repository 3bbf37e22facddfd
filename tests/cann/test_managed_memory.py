"""Managed memory (tests/cann/managed_memory.c): npusim's SoC has no unified memory, so it answers
as CANN's SoCs without UVM do, after CANN's argument checks."""

from __future__ import annotations

import subprocess

INVALID_PARAM, FEATURE_NOT_SUPPORT = 100000, 207000  # ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_FEATURE_NOT_SUPPORT


def test_managed_memory_is_not_supported(npusim_daemon, cann_program) -> None:
    exe = cann_program("managed_memory.c", "-lascendcl")
    r = subprocess.run([str(exe)], env=npusim_daemon.env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n, bad = FEATURE_NOT_SUPPORT, INVALID_PARAM
    assert r.stdout.splitlines() == [
        f"managed {n} 1 1 advise {n} {bad} prefetch {n} {bad} batch {n} {bad}",
        f"bad alloc {bad} {bad}",
        "done",
    ]
