"""The agent's socket against a squatter: another user binds `@npusnap-agent-<pid>` (any
user may bind any abstract name). npusnap must never talk to it, attach must still inject,
and a checkpoint must restore although the name is taken."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from npusnap_cli.platform import agent as ag
from tests.helpers import Workload, criu_works, npusnap, npusnap_cmd
from tests.users import other_user, popen_as

LOOP = "import time\ni = 0\nwhile True:\n    print(i, flush=True); i += 1; time.sleep(0.05)\n"

# Run by the system python as the attacker: squat the name, then answer like an agent or never accept.
SQUATTER = r"""
import socket, sys, time
pid, mode = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0npusnap-agent-" + pid)
s.listen(1 if mode == "answer" else 0)
if mode == "silent":  # fill the backlog: a blocking connect to this name now hangs
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler.connect("\0npusnap-agent-" + pid)
print("squatting", flush=True)
while mode == "answer":
    c, _ = s.accept()
    c.recv(128)
    c.sendall(('{"ok": true, "code": 0, "state": "RUNNING", "error": null, "elapsed_ms": 0, "pid": %s, '
               '"runtime": "/FAKE/libascendcl.so", "lease_ms_left": null, "device": null}\n' % pid).encode())
    c.close()
time.sleep(600)
"""


@pytest.fixture
def squat() -> Iterator:  # type: ignore[type-arg]
    started: list[subprocess.Popen[str]] = []

    def _squat(pid: int, mode: str) -> subprocess.Popen[str]:
        p = popen_as(other_user(), ["/usr/bin/python3", "-c", SQUATTER, str(pid), mode], stdout=subprocess.PIPE)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "squatting"
        return p

    yield _squat
    for p in started:
        p.kill()
        p.wait(timeout=10)


def _start(tmp_path: Path, agent: bool, name: str = "w") -> Workload:
    argv = [sys.executable, "-u", "-c", LOOP]
    if agent:
        argv = [*npusnap_cmd(), "run", "--", *argv]
    env = {**os.environ, "NPUSNAP_AGENT_LOG": str(tmp_path / f"{name}-agent.log")}  # read by an injected agent too
    w = Workload(argv, tmp_path / f"{name}.out", env=env)
    w.wait_for_line(3)
    if agent:
        ag._wait_ready(w.pid, 10)
    return w


def _status(pid: int) -> subprocess.CompletedProcess[str]:
    return npusnap("status", pid, "--json", timeout=30)


@pytest.mark.parametrize("mode", ["answer", "silent"])
def test_status_never_talks_to_a_squatter(tmp_path, squat, mode):
    w = _start(tmp_path, agent=False)
    try:
        squat(w.pid, mode)
        r = _status(w.pid)
        assert r.returncode == 0, r.stderr  # not exit 3, not the squatter's answer
        doc = json.loads(r.stdout)
        assert doc["agent"] is False and doc["runtime"] is None, doc
        assert "FAKE" not in r.stdout + r.stderr
        with pytest.raises(ag.AgentNotFound, match="another process holds"):
            ag.AgentClient(w.pid).status()
    finally:
        w.stop()


@pytest.mark.parametrize("mode", ["answer", "silent"])
def test_attach_injects_despite_a_squatter(tmp_path, squat, mode):
    w = _start(tmp_path, agent=False)
    try:
        squat(w.pid, mode)
        r = npusnap("attach", w.pid, "--json", timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["injected"] is True
        names = ag.agent_sockets(w.pid)
        assert names and names[0].startswith(f"\0npusnap-agent-{w.pid}-"), names  # the random name
        reply = ag.AgentClient(w.pid).status()
        assert reply.ok and reply.pid == w.pid and reply.runtime is None
        doc = json.loads(_status(w.pid).stdout)
        assert doc["agent"] is True and "FAKE" not in json.dumps(doc)
        log = (tmp_path / "w-agent.log").read_text()
        assert f"@npusnap-agent-{w.pid} is taken by another process" in log, log
        assert f"listening on @npusnap-agent-{w.pid}-" in log, log
    finally:
        w.stop()


def test_a_client_refuses_a_listener_that_is_not_the_target(tmp_path, squat):
    """Where the target's descriptors cannot be read, the name is tried, and SO_PEERCRED refuses a squatter."""
    w = _start(tmp_path, agent=False)
    try:
        sq = squat(w.pid, "answer")
        client = ag.AgentClient(w.pid)
        client_sock = socket.socket(socket.AF_UNIX)
        try:
            client_sock.connect(f"\0npusnap-agent-{w.pid}")
            with pytest.raises(ag.AgentImpostor, match=f"belongs to process {sq.pid}|not to process"):
                client._check_peer(client_sock, f"\0npusnap-agent-{w.pid}")
        finally:
            client_sock.close()
    finally:
        w.stop()


@pytest.mark.criu
def test_restore_works_although_the_agent_name_is_squatted(tmp_path, squat):
    if not criu_works():
        pytest.skip("CRIU does not work here")
    w = _start(tmp_path, agent=True)
    ck = tmp_path / "ck"
    try:
        r = npusnap("checkpoint", w.pid, "-D", ck, "--device", "none", timeout=120)
        assert r.returncode == 0, r.stderr
        w.proc.wait(timeout=10)  # reap the checkpointed process: its pid must be free
        squat(w.pid, "answer")  # the attacker takes the name while the job is on disk
        r = npusnap("restore", ck, "--detach", timeout=120)
        assert r.returncode == 0, r.stderr
        assert "another process holds the agent's socket name" in r.stderr
        n = len(w.lines())
        w.wait_for_line(n + 5)  # the restored loop carries on
        reply = ag.AgentClient(w.pid).status()
        assert reply.ok and reply.pid == w.pid and reply.runtime is None
        doc = json.loads(_status(w.pid).stdout)
        assert doc["agent"] is True and "FAKE" not in json.dumps(doc)
        # and it can be checkpointed again: lock/backup/dump go to the real agent
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck2", "--device", "none", "--leave-running", timeout=120)
        assert r.returncode == 0, r.stderr
        assert npusnap("verify", ck, timeout=60).returncode == 0  # the restore's logs keep it valid
    finally:
        w.stop()
