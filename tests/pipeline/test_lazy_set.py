"""`npusnap restore --lazy` of a process set, end to end on a real daemon with real CRIU: every
member runs before its memory is back (each its own `criu lazy-pages`, the daemon filling each
one's device memory) and comes out bit-exact; the page servers end with the restore; a set
whose device memory went through the in-process data path is refused in one line; an interrupt
at random instants leaves the whole set running (the restore committed) or none of it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Workload, npusnap, npusnap_cmd, pid_alive, requires_criu, rewind_to_checkpoint

from .support import interrupt, strip_ready, under_agent
from .test_lazy import SIGINT_TRIALS, STEPS, WORKLOAD, _lazy_servers

pytestmark = [requires_criu, pytest.mark.criu]

WRONG_STATE = 11


class LazySet:
    """Two npusim_lazy workloads, each gated step by step, checkpointed as one set (killed)."""

    def __init__(self, tmp: Path, env: dict[str, str], data_path: str) -> None:
        self.env = env
        self.gates = [tmp / f"gate-{i}" for i in range(2)]
        self.ws = []
        for i, gate in enumerate(self.gates):
            gate.mkdir()
            self.ws.append(Workload(under_agent([sys.executable, str(WORKLOAD), str(STEPS), str(gate)]),
                                    tmp / f"lazy-{i}.out", env=env))
        for w in self.ws:
            w.wait_for_line("ready pid", timeout=60)
        self.ck = tmp / "ck"
        r = npusnap("checkpoint", *(w.pid for w in self.ws), "-D", self.ck, "--data-path", data_path, env=env,
                    timeout=120)
        assert r.returncode == 0, r.stderr
        for w in self.ws:
            w.wait_exit(timeout=30)
            w.proc.wait(timeout=10)  # reaped: a zombie would hold the pid the restore needs

    def rewind(self) -> None:
        for w in self.ws:
            rewind_to_checkpoint(self.ck, w.out, member=w.pid)

    def open_gates(self) -> None:
        for gate in self.gates:
            for k in range(STEPS):
                (gate / f"go-{k}").touch()

    def stop(self) -> None:
        for w in self.ws:
            w.stop()
        for pid in _lazy_servers(self.ck):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def lazy_set(npusim_daemon, tmp_path):  # type: ignore[no-untyped-def]
    sets: list[LazySet] = []

    def make(data_path: str = "direct") -> LazySet:
        sets.append(LazySet(tmp_path, npusim_daemon.env, data_path))
        return sets[-1]

    try:
        yield make
    finally:
        for s in sets:
            s.stop()


def test_a_lazily_restored_set_is_bit_exact(lazy_set, reference) -> None:  # type: ignore[no-untyped-def]
    s = lazy_set()
    ref = reference([sys.executable, str(WORKLOAD), str(STEPS), "-"])
    s.rewind()
    # --detach returns once every member's memory is in; the gated members touched nothing meanwhile.
    r = npusnap("restore", s.ck, "--lazy", "--detach", "--json", env=s.env, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["members"]) == 2, doc
    for m in doc["members"]:
        lazy = m["lazy"]
        assert lazy["pages_status"] == 0 and not lazy["problems"], lazy
        assert lazy["device"]["state"] == "done" and lazy["device"]["bad"] == 0, lazy
        assert lazy["device"]["ready"] == lazy["device"]["chunks"] > 0, lazy
    assert _lazy_servers(s.ck) == []  # every page server ended, reaped
    s.open_gates()
    for w, pid in zip(s.ws, doc["pids"]):
        w.pid = pid
        w.wait_exit(timeout=60)
        assert strip_ready(w.lines()) == ref

    # In the foreground, the gates open: the members read their memory while it comes in.
    s.rewind()
    r = npusnap("restore", s.ck, "--lazy", env=s.env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("its memory comes in lazily") == 2, r.stderr
    for w in s.ws:
        assert strip_ready(w.lines()) == ref
    assert _lazy_servers(s.ck) == []


def test_a_set_saved_through_the_processes_is_refused_lazily(lazy_set) -> None:  # type: ignore[no-untyped-def]
    s = lazy_set("in-process")
    s.rewind()
    r = npusnap("restore", s.ck, "--lazy", env=s.env, timeout=120)
    assert r.returncode == WRONG_STATE, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("npusnap: error: ")]
    assert len(errors) == 1 and "in-process data path" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and _lazy_servers(s.ck) == []
    # Refused before anything started: the set restores in full.
    r = npusnap("restore", s.ck, "--detach", env=s.env, timeout=120)
    assert r.returncode == 0, r.stderr


def test_sigint_at_random_instants_of_a_lazy_set_restore(lazy_set, reference) -> None:  # type: ignore[no-untyped-def]
    s = lazy_set()
    ref = reference([sys.executable, str(WORKLOAD), str(STEPS), "-"])
    seed = int(os.environ.get("NPUSNAP_FAULT_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    pids = [w.pid for w in s.ws]
    for trial in range(SIGINT_TRIALS):
        s.rewind()
        cli = subprocess.Popen([*npusnap_cmd(), "restore", str(s.ck), "--lazy"], env=s.env, text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = interrupt(cli, rng.uniform(0.0, 2.0), again_after=30)  # the gated members run on after a second
        where = (seed, trial, cli.returncode, err)
        assert cli.returncode in (0, 130) and "Traceback" not in err, where
        alive = [pid_alive(p) for p in pids]
        assert all(alive) or not any(alive), where  # the whole set, or none of it
        if all(alive):
            assert err.count("its memory comes in lazily") == 2, where
            for w, p in zip(s.ws, pids):
                os.kill(p, signal.SIGKILL)
                w.pid = p
                w.wait_exit(timeout=30)
        assert _lazy_servers(s.ck) == [], where
    s.open_gates()
    s.rewind()
    r = npusnap("restore", s.ck, "--lazy", env=s.env, timeout=180)
    assert r.returncode == 0, (seed, r.stderr)
    for w in s.ws:
        assert strip_ready(w.lines()) == ref
