"""The agent loaded at launch (LD_PRELOAD): protocol, permissions, state machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from npusnap_cli.platform import agent as ag

from .support import python_loop_argv


def raw_request(pid: int, line: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(f"\0npusnap-agent-{pid}")
        s.sendall(line)
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


def preload(agent_lib: Path, **extra: str) -> dict[str, str]:
    return {"LD_PRELOAD": str(agent_lib), **extra}


def check_fresh_agent(pid: int) -> None:
    reply = ag._wait_ready(pid, 10)
    assert reply.ok and reply.code == 0 and reply.pid == pid
    assert reply.state == "RUNNING" and reply.error is None
    assert reply.runtime is None and reply.device is None
    status = ag.AgentClient(pid).status()
    assert status.ok and status.state == "RUNNING" and status.runtime is None


def test_ping_status_python_target(spawn, agent_lib, tmp_path):
    log = tmp_path / "agent.log"
    t = spawn(python_loop_argv(), env=preload(agent_lib, NPUSNAP_AGENT_LOG=str(log)))
    t.wait_ready()
    check_fresh_agent(t.pid)
    assert ag.has_agent(t.pid)
    text = log.read_text()
    assert f"listening on @npusnap-agent-{t.pid}" in text
    assert "ping -> ok=1" in text and "status -> ok=1" in text


def test_ping_status_c_target(spawn, agent_lib, c_programs):
    t = spawn([str(c_programs["sleeper"])], env=preload(agent_lib))
    t.wait_ready()
    check_fresh_agent(t.pid)
    t.wait_numbers_past(3)
    assert not any("EINTR" in line for line in t.lines())


def test_device_commands_without_runtime(spawn, agent_lib):
    t = spawn(python_loop_argv(), env=preload(agent_lib))
    t.wait_ready()
    client = ag.AgentClient(t.pid)
    ag._wait_ready(t.pid, 10)
    for call in (lambda: client.lock(1), client.backup, client.restore, client.unlock):
        with pytest.raises(ag.AgentError) as ei:
            call()
        assert ei.value.code == ag.E_NO_RUNTIME
        assert ei.value.reply.error == "no device runtime loaded in this process"
        assert ei.value.hint


def test_malformed_requests(spawn, agent_lib):
    t = spawn(python_loop_argv(), env=preload(agent_lib))
    t.wait_ready()
    ag._wait_ready(t.pid, 10)
    bad = [b"bogus\n", b"lock abc\n", b"lock -5\n", b"ping extra\n", b"lock 1 2 3\n", b"ping 1 2\n",
           b"lock 1 -2\n", b"renew\n", b"renew 0\n", b"renew x\n", b"\n"]
    for line in [*bad, b"x" * 500 + b"\n"]:
        reply = ag.AgentReply.from_json(json.loads(raw_request(t.pid, line)))
        assert not reply.ok and reply.code == ag.E_REQUEST, line
    # a client that connects and says nothing does not wedge the agent
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(f"\0npusnap-agent-{t.pid}")
    assert ag.AgentClient(t.pid).ping().ok


def test_not_found():
    # pid 1 exists but has no agent; a huge pid does not exist
    with pytest.raises(ag.AgentNotFound) as ei:
        ag.AgentClient(1).ping()
    assert "npusnap run" in (ei.value.hint or "") and "npusnap attach" in (ei.value.hint or "")
    with pytest.raises(ag.AgentNotFound, match="no such process"):
        ag.AgentClient(4_000_000).ping()
    assert not ag.has_agent(1)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to another uid")
def test_peer_of_other_uid_is_refused(spawn, agent_lib):
    t = spawn(python_loop_argv(), env=preload(agent_lib))
    t.wait_ready()
    ag._wait_ready(t.pid, 10)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)  # nobody
            try:
                ag.AgentClient(t.pid).ping()
                result = "accepted"
            except ag.AgentError as e:
                result = f"refused {e.code} {e.reply.error}"
            except Exception as e:  # noqa: BLE001
                result = f"other {type(e).__name__} {e}"
            os.write(w, result.encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            result = f.read().decode()
    finally:
        os.waitpid(child, 0)
    assert result.startswith(f"refused {ag.E_DENIED} permission denied"), result
    assert ag.AgentClient(t.pid).ping().ok  # the owner (root here) still gets in


FAKE_RUNTIME_PY = (
    "import ctypes, os, sys, time\n"
    "lib = ctypes.CDLL(sys.argv[1])  # RTLD_LOCAL: invisible to dlsym(RTLD_DEFAULT)\n"
    "print('ready', os.getpid(), flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def spawn_fake_runtime(spawn, agent_lib, c_programs, **env):  # type: ignore[no-untyped-def]
    t = spawn(
        [sys.executable, "-c", FAKE_RUNTIME_PY, str(c_programs["fake_runtime"])],
        env=preload(agent_lib, **env),
    )
    t.wait_ready()
    ag._wait_ready(t.pid, 10)
    return t


def test_state_machine_with_rtld_local_runtime(spawn, agent_lib, c_programs):
    t = spawn_fake_runtime(spawn, agent_lib, c_programs)
    c = ag.AgentClient(t.pid)
    st = c.status()
    assert st.runtime == str(c_programs["fake_runtime"])
    assert st.device == {"state": "RUNNING", "locks": 0, "backups": 0, "restores": 0, "unlocks": 0}

    # wrong orders are refused by the agent, never passed to the runtime
    for call in (c.backup, c.restore, c.unlock):
        with pytest.raises(ag.AgentError) as ei:
            call()
        assert ei.value.code == ag.E_STATE
    r = c.lock(5)
    assert r.ok and r.state == "LOCKED" and r.device and r.device["locks"] == 1
    with pytest.raises(ag.AgentError, match="already locked"):
        c.lock(5)
    with pytest.raises(ag.AgentError, match="lock the process first|restore"):
        c.restore()
    assert c.backup().state == "BACKED_UP"
    with pytest.raises(ag.AgentError, match="already backed up"):
        c.backup()
    assert c.restore().state == "LOCKED"
    r = c.unlock()
    assert r.state == "RUNNING"
    assert r.device == {"state": "RUNNING", "locks": 1, "backups": 1, "restores": 1, "unlocks": 1}
    # unlock straight from BACKED_UP is allowed, as in CANN
    c.lock(5)
    c.backup()
    assert c.unlock().state == "RUNNING"


def test_lock_timeout_is_undone(spawn, agent_lib, c_programs):
    t = spawn_fake_runtime(spawn, agent_lib, c_programs, FAKE_LOCK_DELAY_MS="1000")
    c = ag.AgentClient(t.pid)
    t0 = time.monotonic()
    with pytest.raises(ag.LockTimeoutError) as ei:
        c.lock(0.2)
    assert ei.value.code == ag.LOCK_TIMEOUT == 507905
    assert time.monotonic() - t0 < 0.9
    assert ei.value.reply.state == "RUNNING"
    # while the abandoned lock is still inside the runtime, a new one is refused
    with pytest.raises(ag.AgentError) as ei2:
        c.lock(5)
    assert ei2.value.code == ag.E_BUSY
    # once it returns, the agent unlocks at once: the workload is not left locked
    deadline = time.monotonic() + 5
    while True:
        st = c.status()
        if st.device and st.device["unlocks"] == 1:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    assert st.state == "RUNNING" and st.device["state"] == "RUNNING" and st.device["locks"] == 1
    # and a lock with enough time works afterwards
    assert c.lock(5).state == "LOCKED"
    assert c.unlock().state == "RUNNING"


def test_loaded_twice_is_idempotent(spawn, agent_lib, injector):
    t = spawn(python_loop_argv(), env=preload(agent_lib))
    t.wait_ready()
    ag._wait_ready(t.pid, 10)
    # a second copy under another path: it must not steal or break the socket
    with tempfile.TemporaryDirectory() as d:
        copy = Path(d) / "libnpusnap_agent_copy.so"
        shutil.copy(agent_lib, copy)
        subprocess.run([str(injector), str(t.pid), str(copy)], check=True, timeout=30)
        time.sleep(0.2)
        maps = Path(f"/proc/{t.pid}/maps").read_text()
        assert str(copy) in maps
    for _ in range(3):
        assert ag.AgentClient(t.pid).ping().ok
    threads = [p.read_text().strip() for p in Path(f"/proc/{t.pid}/task").glob("*/comm")]
    assert threads.count("npusnap-agent") == 1, threads


FORKING_PY = (
    "import os, time\n"
    "child = os.fork()\n"
    "if child == 0:\n"
    "    while True: time.sleep(0.05)\n"
    "print('ready', os.getpid(), child, flush=True)\n"
    "try:\n"
    "    while True: time.sleep(0.05)\n"
    "finally:\n"
    "    os.kill(child, 9)\n"
)


def test_forked_child_gets_its_own_agent(spawn, agent_lib):
    t = spawn([sys.executable, "-c", FORKING_PY], env=preload(agent_lib))
    lines = t.wait_for(lambda ls: any(x.startswith("ready") for x in ls), 10, "ready")
    child = int(next(x for x in lines if x.startswith("ready")).split()[2])
    try:
        assert ag._wait_ready(t.pid, 10).pid == t.pid
        assert ag._wait_ready(child, 10).pid == child
        # the parent's socket is served by the parent only, the child's by the child
        assert ag.AgentClient(t.pid).ping().pid == t.pid
    finally:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass
