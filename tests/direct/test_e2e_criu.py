"""End to end through the agent and real CRIU: lock, export (direct), backup external, CRIU dump
(the process dies), daemon restart, CRIU restore, restore external, import, unlock; the
workload's output is identical to an uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npusnap_cli import native
from npusnap_cli.backends.direct import restore_direct
from npusnap_cli.image.format import checksum_file
from npusnap_cli.platform import agent as ag
from npusnap_cli.platform import simimages
from tests.helpers import kill_and_wait, pid_alive

from ..agent.support import criu_binary

WORKLOAD = r"""
import hashlib, os, sys, time
import numpy as np
import npusim

steps, sleep_s = int(sys.argv[1]), float(sys.argv[2])
npusim.init()
npusim.set_device(0)
n = 1 << 20
x = npusim.malloc(n * 4)
y = npusim.malloc(n * 4)
z = npusim.malloc(64 << 20)  # device memory that is mostly zeros
npusim.memcpy_h2d(x, np.random.default_rng(7).random(n, dtype=np.float32))
npusim.memset(z, 0, 64 << 20)
npusim.launch_fill(y, n, 1.0)
npusim.synchronize_device()  # the default stream: not ordered with `stream`
stream = npusim.create_stream()
print("ready", os.getpid(), flush=True)
for step in range(steps):
    npusim.launch_axpy(n, 0.5, x, y, stream)
    npusim.launch_copy(z + (step % 16) * 4096, y, 4096, stream)
    npusim.synchronize_stream(stream)
    got = np.empty(n, np.float32)
    npusim.memcpy_d2h(got, y)
    tail = np.empty(4096, np.uint8)
    npusim.memcpy_d2h(tail, z + (step % 16) * 4096)
    print(f"step {step} {hashlib.blake2b(got.tobytes() + tail.tobytes(), digest_size=8).hexdigest()}", flush=True)
    time.sleep(sleep_s)
print("done", flush=True)
"""

STEPS = 60


def _run(argv: list[str], out: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(out, "wb") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def _wait_for(out: Path, text: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines()
        if any(text in line for line in lines):
            return lines
        time.sleep(0.02)
    raise AssertionError(f"no {text!r} in {out.read_text()[-500:]}")


@pytest.mark.criu
def test_direct_checkpoint_restore_through_agent_and_criu(npusim_daemon, tmp_path):
    criu = criu_binary()
    if not criu or os.geteuid() != 0:
        pytest.skip("needs root and CRIU")
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)

    ref_out = tmp_path / "ref.out"
    ref = _run([sys.executable, str(script), str(STEPS), "0"], ref_out, npusim_daemon.env)
    assert ref.wait(timeout=60) == 0, ref_out.read_text()[-2000:]
    expected = [line for line in ref_out.read_text().splitlines() if not line.startswith("ready")]

    env = {**npusim_daemon.env, "LD_PRELOAD": str(native.AGENT_LIB),
           "NPUSNAP_AGENT_LOG": str(tmp_path / "agent.log")}
    out = tmp_path / "run.out"
    proc = _run([sys.executable, str(script), str(STEPS), "0.05"], out, env)
    pid = proc.pid
    try:
        _wait_for(out, "step 5")
        ag._wait_ready(pid, 10)
        c = ag.AgentClient(pid)
        assert simimages.supports_direct(pid)
        root = tmp_path / "ckpt"
        (root / "device").mkdir(parents=True)
        (root / "criu").mkdir()

        c.lock(10)
        exported = simimages.export_device(pid, root / "device")  # socket from the process's env
        assert exported.allocations == 3 and exported.nonzero_bytes < exported.bytes
        assert c.backup(external=True).device["data_path"] == "external"  # type: ignore[index]
        with pytest.raises(ag.AgentError) as ei:
            c.restore()  # the data is in files: a plain restore is refused
        assert ei.value.code == ag.E_STATE

        r = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(root / "criu"), "-o", "dump.log"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (root / "criu" / "dump.log").read_text()[-3000:]
        proc.wait(timeout=10)
        files = exported.files  # checksummed while streaming: they match a fresh read
        for f in files:
            assert checksum_file(root / f.path) == (f.size, f.checksum)

        npusim_daemon.restart()
        r = subprocess.run([criu, "restore", "-D", str(root / "criu"), "-d", "-o", "restore.log"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (root / "criu" / "restore.log").read_text()[-3000:]
        assert pid_alive(pid)

        device_files = [f for f in files if f.path.startswith("device/")]
        restore_direct(c, pid, root / "device", device_files)
        assert c.status().state == "LOCKED"
        c.unlock()

        deadline = time.monotonic() + 60
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        got = [line for line in out.read_text().splitlines() if not line.startswith("ready")]
        assert got == expected
    finally:
        kill_and_wait(pid)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
