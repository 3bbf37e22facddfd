"""The premise of npusnap, shown with real CRIU: a process using the NPU cannot be dumped as it
is (its driver connection is an external socket and its data lives in the daemon), but after an
in-process Lock + Backup it dumps, restores (here onto a restarted daemon) and, after Restore +
Unlock, finds its device memory bit-exact at the same addresses."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from npusim_helpers import pid_alive

pytestmark = pytest.mark.criu

WORKLOAD = """
import signal, time
import numpy as np
import npusim

npusim.init(); npusim.set_device(0)
data = np.random.default_rng(3).integers(0, 255, 3 << 20, dtype=np.uint8)
p = npusim.malloc(data.size)
npusim.memcpy_h2d(p, data)
s = npusim.create_stream()
todo = []
signal.signal(signal.SIGUSR1, lambda *_: todo.append("backup"))
signal.signal(signal.SIGUSR2, lambda *_: todo.append("restore"))
print("ready", p, flush=True)
while True:
    time.sleep(0.02)
    while todo:
        if todo.pop(0) == "backup":
            npusim.snapshot_lock(); npusim.snapshot_backup()
            print("backed-up", flush=True)
        else:
            npusim.snapshot_restore(); npusim.snapshot_unlock()
            out = np.zeros_like(data); npusim.memcpy_d2h(out, p)
            npusim.launch_fill(p, 16, 1.0, s); npusim.synchronize_stream(s)
            print("restored", "bit-exact" if (out == data).all() else "MISMATCH", p, flush=True)
"""


def _criu() -> str:
    criu = os.environ.get("NPUSNAP_CRIU") or shutil.which("criu") or "/usr/local/sbin/criu"
    try:
        ok = subprocess.run([criu, "check"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip(f"no working CRIU ({criu} check failed)")
    return criu


def _wait_for(log: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text()
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not seen in workload output:\n{log.read_text()}")


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def test_criu_dumps_an_npusim_process_only_after_backup(npusim_daemon, tmp_path: Path) -> None:
    criu = _criu()
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    log = tmp_path / "workload.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(["setsid", sys.executable, "-u", str(script)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=npusim_daemon.env)
    pid = proc.pid
    restored = False
    try:
        address = _wait_for(log, "ready").split()[1]

        plain = tmp_path / "plain"
        plain.mkdir()
        res = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(plain), "-o", "dump.log"],
                             capture_output=True, timeout=60)
        assert res.returncode != 0, "CRIU dumped a process holding a device connection"
        assert "External socket" in (plain / "dump.log").read_text()
        assert proc.poll() is None, "a failed dump must leave the workload running"

        os.kill(pid, signal.SIGUSR1)
        _wait_for(log, "backed-up")
        image = tmp_path / "image"
        image.mkdir()
        res = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(image), "-o", "dump.log"],
                             capture_output=True, timeout=60)
        assert res.returncode == 0, (image / "dump.log").read_text()[-3000:]
        proc.wait(timeout=10)  # CRIU killed it; reap so its pid is free for the restore

        npusim_daemon.restart()
        res = subprocess.run([criu, "restore", "-D", str(image), "-d", "-o", "restore.log"],
                             capture_output=True, timeout=60)
        assert res.returncode == 0, (image / "restore.log").read_text()[-3000:]
        restored = True
        assert pid_alive(pid)
        os.kill(pid, signal.SIGUSR2)
        assert f"restored bit-exact {address}" in _wait_for(log, "restored")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if restored and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not _gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
