"""CANN's documented semantics of the runtime surface (tests/cann/cann_api.c): errors and system
info, contexts, stream/event configuration, host callbacks, allocators, aclrtMemset on host
memory, overflow controls, profiling, tdt channels and queues, and the P2P sample's peer-access
order across aclrtResetDeviceForce."""

from __future__ import annotations

import subprocess


def test_cann_api_semantics(npusim_daemon, device_env, build_program, tmp_path) -> None:
    exe = build_program("cann_api")
    env = {**npusim_daemon.env, "LD_LIBRARY_PATH": device_env["LD_LIBRARY_PATH"],
           "CANN_API_PROF_DIR": str(tmp_path / "prof")}
    r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    failures = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert r.returncode == 0 and not failures, f"{failures}\n{r.stdout[-2000:]}{r.stderr[-1000:]}"
    last = r.stdout.splitlines()[-1]
    assert last.startswith("checks ") and last.endswith(" failed 0") and int(last.split()[1]) >= 100, last
