"""A C program written against acl/acl.h (tests/workloads/acl_threads.c): several threads,
each with its own stream, kernels and async copies in flight when the checkpoint starts.
Checkpoint, kill, restart the daemon, restore: the output equals an uninterrupted run's."""

from __future__ import annotations

import json
import signal

import pytest

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu

from .support import strip_ready, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS, THREADS = 50, 4, 20, 3  # ~2.8 s
N, M = 1 << 17, 320  # acl_threads.c: vector and matrix sizes (floats)
PER_THREAD_BYTES = 2 * N * 4 + 4 * M * M * 4


def test_agent_finds_a_runtime_linked_into_the_program(npusim_daemon, acl_threads, tmp_path) -> None:
    """Minimal form of the bug: the agent's status of a plain -lascendcl program."""
    w = Workload(under_agent([str(acl_threads), "1000", "20", "1"]), tmp_path / "out", env=npusim_daemon.env)
    try:
        w.wait_for_line("step 1 ", timeout=30)
        r = npusnap("status", w.pid, "--json", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["agent"] is True
        assert (doc["runtime"] or "").endswith("/libascendcl.so"), doc
    finally:
        w.stop()


def test_threads_with_work_in_flight_checkpoint_restore(npusim_daemon, acl_threads, reference, tmp_path) -> None:
    ref = reference([str(acl_threads), str(STEPS), "0", str(THREADS)])
    assert len(ref) == STEPS + 1
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent([str(acl_threads), str(STEPS), str(SLEEP_MS), str(THREADS)]),
                 tmp_path / "threads.out", env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--json", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        dev = json.loads(r.stdout)["device"]
        assert dev["backend"] == "sim" and dev["devices"] == [0]
        assert dev["allocations"] == 6 * THREADS and dev["bytes"] == THREADS * PER_THREAD_BYTES
        assert w.proc.wait(timeout=10) == -signal.SIGKILL and not pid_alive(w.pid)
        at_checkpoint = strip_ready(w.lines())
        assert AT < len(at_checkpoint) < STEPS and at_checkpoint == ref[: len(at_checkpoint)]

        npusim_daemon.restart()
        gate.open()
        rs = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        assert strip_ready(w.lines()) == ref
    finally:
        w.stop()
