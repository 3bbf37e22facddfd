"""The agent survives a real CRIU dump and restore: same abstract socket name,
same state, and the workload carries on."""

from __future__ import annotations

import sys

import pytest

from npusnap_cli.platform import agent as ag

from .support import assert_sequence, dump_and_restore, kill_pid, python_loop_argv

pytestmark = pytest.mark.criu


@pytest.mark.parametrize("how", ["preload", "injected"])
def test_agent_answers_after_criu_restore(criu, spawn, agent_lib, injector, tmp_path, how):
    env = {"LD_PRELOAD": str(agent_lib)} if how == "preload" else {}
    t = spawn(python_loop_argv(), env=env)
    try:
        t.wait_ready()
        if how == "injected":
            ag.inject(t.pid, library=agent_lib, injector=injector)
        assert ag._wait_ready(t.pid, 10).ok
        n = len(t.wait_numbers_past(3))
        dump_and_restore(criu, t, tmp_path / "images")
        reply = ag.AgentClient(t.pid).ping()
        assert reply.ok and reply.pid == t.pid and reply.state == "RUNNING"
        assert_sequence(t.wait_numbers_past(n + 10))
    finally:
        kill_pid(t.pid)


FAKE_RUNTIME_PY = (
    "import ctypes, os, sys, time\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "print('ready', os.getpid(), flush=True)\n"
    "i = 0\n"
    "while True:\n"
    "    print(i, flush=True); i += 1\n"
    "    time.sleep(0.05)\n"
)


def test_snapshot_state_survives_criu(criu, spawn, agent_lib, c_programs, tmp_path):
    """lock + backup, dump, restore: the restored agent still knows it is BACKED_UP."""
    t = spawn(
        [sys.executable, "-u", "-c", FAKE_RUNTIME_PY, str(c_programs["fake_runtime"])],
        env={"LD_PRELOAD": str(agent_lib), "NPUSNAP_AGENT_LOG": str(tmp_path / "agent.log")},
    )
    try:
        t.wait_ready()
        c = ag.AgentClient(t.pid)
        ag._wait_ready(t.pid, 10)
        c.lock(5)
        assert c.backup().state == "BACKED_UP"
        dump_and_restore(criu, t, tmp_path / "images")
        st = c.status()
        assert st.state == "BACKED_UP" and st.device and st.device["backups"] == 1
        assert c.restore().state == "LOCKED"
        assert c.unlock().state == "RUNNING"
        assert_sequence(t.wait_numbers_past(len(t.numbers()) + 5))
        log = (tmp_path / "agent.log").read_text()
        assert "backup -> ok=1" in log and "unlock -> ok=1" in log
    finally:
        kill_pid(t.pid)
