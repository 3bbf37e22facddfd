"""End to end on the software NPU: a Python workload that uses libascendcl.so
through the `npusim` extension (so the runtime is RTLD_LOCAL, invisible to
dlsym(RTLD_DEFAULT)) is locked, backed up, restored and unlocked through the
agent, and its device data and work are intact afterwards."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from npusnap_cli.platform import agent as ag

from .support import dump_and_restore, kill_pid

WORKLOAD = r"""
import os, sys, time
import numpy as np
import npusim

npusim.init()
npusim.set_device(0)
n = 4096
x = npusim.malloc(n * 4)
y = npusim.malloc(n * 4)
npusim.memcpy_h2d(x, np.arange(n, dtype=np.float32))
print("ready", os.getpid(), flush=True)
i = 0
while True:
    try:
        npusim.launch_fill(y, n, float(i), 0)
        npusim.synchronize_device()
        got_y = np.empty(n, dtype=np.float32)
        got_x = np.empty(n, dtype=np.float32)
        npusim.memcpy_d2h(got_y, y)
        npusim.memcpy_d2h(got_x, x)
        ok = bool((got_y == i).all() and (got_x == np.arange(n)).all())
        print(i if ok else f"BAD {i}", flush=True)
    except npusim.AclError as e:
        print(f"ERR {e.code} {e}", flush=True)
    i += 1
    time.sleep(0.02)
"""


def _installed_python() -> list[str]:
    """An interpreter that sees the installed package (not the source tree)."""
    return [sys.executable, "-I"]


@pytest.fixture(scope="module")
def npusimd() -> Iterator[dict[str, str]]:
    probe = subprocess.run(
        [*_installed_python(), "-c",
         "import npusim; from npusnap_cli import native as n; "
         "print(n.NPUSIMD); print(n.AGENT_LIB); print(n.INJECTOR)"],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    lines = probe.stdout.split()
    if probe.returncode != 0 or len(lines) != 3 or not Path(lines[0]).exists():
        pytest.skip("npusim is not installed (pip install --no-build-isolation .)")
    d = tempfile.mkdtemp(prefix="npx-")  # short: Unix socket paths are limited to 108 bytes
    sock = os.path.join(d, "d.sock")
    proc = subprocess.Popen(
        [lines[0], "--socket", sock, "--devices", "1", "--memory", str(64 << 20), "--foreground"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith("ready"):
            pytest.fail(f"npusimd did not start: {line!r}")
        yield {"socket": sock, "agent_lib": lines[1], "injector": lines[2]}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        for f in Path(d).iterdir():
            f.unlink()
        os.rmdir(d)


@pytest.mark.parametrize(
    ("how", "with_criu"),
    [("preload", False), ("injected", False), pytest.param("preload", True, marks=pytest.mark.criu)],
    ids=["preload", "injected", "preload-criu-dump-restore"],
)
def test_lock_backup_restore_unlock_on_npusim(npusimd, spawn, tmp_path, request, how, with_criu):
    criu = request.getfixturevalue("criu") if with_criu else None
    log = tmp_path / "agent.log"
    env = {"NPUSIM_SOCKET": npusimd["socket"], "NPUSNAP_AGENT_LOG": str(log)}
    if how == "preload":
        env["LD_PRELOAD"] = npusimd["agent_lib"]
    t = spawn([*_installed_python(), "-u", "-c", WORKLOAD], env=env)
    try:
        t.wait_ready(30)
        if how == "injected":  # into a process with the runtime's threads running
            t.wait_numbers_past(3)
            ag.inject(t.pid, library=npusimd["agent_lib"], injector=npusimd["injector"])
        c = ag.AgentClient(t.pid)
        ag._wait_ready(t.pid, 10)
        n = len(t.wait_numbers_past(3))

        st = c.status()
        assert st.runtime and st.runtime.endswith("libascendcl.so"), st
        assert st.state == "RUNNING" and st.device and st.device["state"] == "RUNNING"
        assert st.device["allocations"] >= 2

        with pytest.raises(ag.AgentError) as ei:
            c.backup()  # wrong order: refused by the agent
        assert ei.value.code == ag.E_STATE

        r = c.lock(10)
        assert r.state == "LOCKED" and r.device and r.device["state"] == "LOCKED"
        frozen = len(t.numbers())
        r = c.backup()
        assert r.state == "BACKED_UP" and r.device and r.device["state"] == "BACKED_UP"
        time.sleep(0.3)
        assert len(t.numbers()) <= frozen + 1, "device work went on while locked"
        if criu:
            # the full checkpoint: the process is dumped (and killed), then restored
            dump_and_restore(criu, t, tmp_path / "images")
            st = c.status()
            assert st.state == "BACKED_UP" and st.pid == t.pid
        r = c.restore()
        assert r.state == "LOCKED"
        r = c.unlock()
        assert r.state == "RUNNING" and r.device and r.device["state"] == "RUNNING"

        after = t.wait_numbers_past(max(n, frozen) + 10, timeout=20)
        bad = [x for x in t.lines() if x.startswith(("BAD", "ERR"))]
        assert not bad, bad
        assert after == list(range(after[0], after[0] + len(after)))
        text = log.read_text()
        for cmd in ("lock 10000 -> ok=1", "backup -> ok=1", "restore -> ok=1", "unlock -> ok=1"):
            assert cmd in text, text
    finally:
        kill_pid(t.pid)
