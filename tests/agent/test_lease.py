"""The agent holds a lock on a lease: if nobody renews it, the agent undoes the
lock by itself (unlock; restore + unlock when backed up). The lease counts only
time the process ran, so a SIGSTOP (or a CRIU freeze) does not use it up."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from npusnap_cli.platform import agent as ag
from tests.helpers import proc_state

from .test_agent import raw_request, spawn_fake_runtime
from .test_npusim_e2e import WORKLOAD, _installed_python, npusimd  # noqa: F401  (fixture)

# Bound on a lease's expiry in wall-clock time: the ticker counts at most 100 ms a wakeup (agent.c),
# so on a loaded host, where it wakes late, a lease runs out later than the clock says.
EXPIRY_S = 60


def wait_state(c: ag.AgentClient, state: str, timeout: float) -> ag.AgentReply:
    deadline = time.monotonic() + timeout
    while True:
        st = c.status()
        if st.state == state:
            return st
        assert time.monotonic() < deadline, f"still {st.state} after {timeout} s: {st}"
        time.sleep(0.05)


def test_lease_expiry_in_locked_unlocks(spawn, agent_lib, c_programs, tmp_path):
    log = tmp_path / "agent.log"
    t = spawn_fake_runtime(spawn, agent_lib, c_programs, NPUSNAP_AGENT_LOG=str(log))
    c = ag.AgentClient(t.pid)
    assert c.status().lease_ms_left is None
    t0 = time.monotonic()
    r = c.lock(5, lease_s=0.5)
    assert r.state == "LOCKED" and r.lease_ms_left is not None and 0 < r.lease_ms_left <= 500
    st = wait_state(c, "RUNNING", EXPIRY_S)
    assert time.monotonic() - t0 >= 0.45
    assert st.lease_ms_left is None
    assert st.device and st.device["unlocks"] == 1 and st.device["state"] == "RUNNING"
    assert "lease expired while LOCKED: unlocked by the agent" in log.read_text()
    # fencing: the lease ran out, so renew says the CLI lost it (status too); unlock is a wrong order
    with pytest.raises(ag.AgentError) as ei:
        c.renew(1)
    assert ei.value.code == ag.E_LEASE_LOST
    assert c.status().lease_lost is True
    with pytest.raises(ag.AgentError) as ei:
        c.unlock()
    assert ei.value.code == ag.E_STATE
    c.lock(5, lease_s=5)  # a new lock starts a new lease: no longer lost
    assert c.status().lease_lost is False
    c.renew(5)
    c.unlock()



def test_lock_without_lease_never_expires(spawn, agent_lib, c_programs):
    t = spawn_fake_runtime(spawn, agent_lib, c_programs)
    c = ag.AgentClient(t.pid)
    r = c.lock(5)  # the old form: no lease
    assert r.state == "LOCKED" and r.lease_ms_left is None
    time.sleep(0.6)
    assert c.status().state == "LOCKED"
    with pytest.raises(ag.AgentError) as ei:
        c.renew(1)
    assert ei.value.code == ag.E_STATE
    assert c.unlock().state == "RUNNING"


def test_renew_keeps_the_lock_and_unlock_disarms(spawn, agent_lib, c_programs):
    t = spawn_fake_runtime(spawn, agent_lib, c_programs)
    c = ag.AgentClient(t.pid)
    c.lock(5, lease_s=2)  # renewed every 0.1 s: lasts however late a loaded host runs this loop
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        r = c.renew(2)
        assert r.ok and r.state == "LOCKED" and r.lease_ms_left is not None and r.lease_ms_left > 1500
        time.sleep(0.1)
    assert c.backup().state == "BACKED_UP"
    r = c.renew(2)
    assert r.state == "BACKED_UP"
    # a refused second lock leaves the lease armed
    with pytest.raises(ag.AgentError):
        c.lock(5, lease_s=10)
    assert (c.status().lease_ms_left or 0) <= 2000
    # stop renewing: the agent restores and unlocks by itself
    st = wait_state(c, "RUNNING", EXPIRY_S)
    assert st.device == {"state": "RUNNING", "locks": 1, "backups": 1, "restores": 1, "unlocks": 1}
    # an explicit unlock ends the lease
    c.lock(5, lease_s=0.3)
    r = c.unlock()
    assert r.state == "RUNNING" and r.lease_ms_left is None
    raw = json.loads(raw_request(t.pid, b"renew 100\n"))
    assert raw["ok"] is False and raw["code"] == ag.E_STATE and raw["lease_ms_left"] is None


def test_sigstop_longer_than_the_lease_does_not_expire_it(spawn, agent_lib, c_programs):
    t = spawn_fake_runtime(spawn, agent_lib, c_programs)
    c = ag.AgentClient(t.pid)
    c.lock(5, lease_s=2.0)  # the time to the SIGSTOP is run time: on a loaded host, a second or so
    os.kill(t.pid, signal.SIGSTOP)
    try:
        time.sleep(4.0)  # twice the lease, in wall-clock time
    finally:
        os.kill(t.pid, signal.SIGCONT)
    st = c.status()
    assert st.state == "LOCKED", st
    assert st.lease_ms_left is not None and st.lease_ms_left > 500, st
    st = wait_state(c, "RUNNING", EXPIRY_S)  # and it still runs out in run time
    assert st.device and st.device["unlocks"] == 1


def test_a_frozen_process_tells_whether_its_lease_ran_out(spawn, agent_lib, c_programs):
    """What the checkpoint asks once CRIU has frozen the process and the agent cannot answer
    (AgentBackend.frozen_by_criu, whose renewals stop meanwhile): read from the process's memory,
    the lease held, or it had run out before the freeze and the agent had taken the workload back."""
    from npusnap_cli.backends.agent import AgentBackend
    from npusnap_cli.backends.base import BackendName
    from npusnap_cli.errors import LeaseLost

    t = spawn_fake_runtime(spawn, agent_lib, c_programs)
    held = AgentBackend(t.pid, BackendName.SIM)
    held.lock(5, lease=30)
    assert held.last_reply is not None and held.last_reply.lease_lost_at
    with held.frozen_by_criu():
        os.kill(t.pid, signal.SIGSTOP)  # as CRIU's freeze
    os.kill(t.pid, signal.SIGCONT)
    held.unlock()

    lost = AgentBackend(t.pid, BackendName.SIM)
    lost.lock(5, lease=0.3)
    c = ag.AgentClient(t.pid)
    with pytest.raises(LeaseLost, match="ran out before CRIU froze it"):
        with lost.frozen_by_criu():  # renewed here, then not: as for a CLI stopped past its lease
            wait_state(c, "RUNNING", EXPIRY_S)  # the agent took it back
            os.kill(t.pid, signal.SIGSTOP)
    os.kill(t.pid, signal.SIGCONT)
    lost.release()

    older = AgentBackend(t.pid, BackendName.SIM)
    older.lock(5, lease=0.3)
    older._lease_lost_at = None  # as from an agent older than the field: not known, the dump goes on as before
    with older.frozen_by_criu():
        wait_state(c, "RUNNING", EXPIRY_S)
    older.release()


def test_an_agent_whose_queue_is_full_is_an_agent_problem(spawn, agent_lib, c_programs):
    """An agent that accepts nobody (stopped here; busy with a long restore in a set) fills its
    queue of connections (8): a connect then fails with EAGAIN, which is an AgentProblem like a
    timeout, not an exception that ends the lease keeper's thread (it did, with a traceback, in a
    4-rank set's restore in CI)."""
    t = spawn_fake_runtime(spawn, agent_lib, c_programs)
    client = ag.AgentClient(t.pid, connect_timeout=0.2)
    os.kill(t.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while proc_state(t.pid) != "T":  # the signal is delivered after kill() returns
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(12):
            with pytest.raises(ag.AgentProblem):
                client.request("status", timeout=0.05)
    finally:
        os.kill(t.pid, signal.SIGCONT)
    deadline = time.monotonic() + 30  # once it has drained its queue, it answers again
    while True:
        try:
            assert ag.AgentClient(t.pid).status().state == "RUNNING"
            break
        except ag.AgentProblem:
            assert time.monotonic() < deadline, "the agent never answered again"
            time.sleep(0.05)


def test_lease_expiry_in_backed_up_restores_device_data(npusimd, spawn, tmp_path):  # noqa: F811
    log = tmp_path / "agent.log"
    env = {"NPUSIM_SOCKET": npusimd["socket"], "NPUSNAP_AGENT_LOG": str(log),
           "LD_PRELOAD": npusimd["agent_lib"]}
    t = spawn([*_installed_python(), "-u", "-c", WORKLOAD], env=env)
    t.wait_ready(30)
    c = ag.AgentClient(t.pid)
    ag._wait_ready(t.pid, 10)
    t.wait_numbers_past(3)
    c.lock(10, lease_s=0.6)
    r = c.backup()
    assert r.state == "BACKED_UP" and r.device and r.device["state"] == "BACKED_UP"
    frozen = len(t.numbers())
    time.sleep(0.2)
    assert len(t.numbers()) <= frozen + 1
    st = wait_state(c, "RUNNING", EXPIRY_S)
    assert st.device and st.device["state"] == "RUNNING" and st.lease_ms_left is None
    after = t.wait_numbers_past(frozen + 10, timeout=20)
    bad = [x for x in t.lines() if x.startswith(("BAD", "ERR"))]
    assert not bad, bad  # every device byte came back at the same address
    assert after == list(range(after[0], after[0] + len(after)))
    text = log.read_text()
    assert "lease expired while BACKED_UP: device state restored" in text
    assert "unlocked by the agent" in text
