"""Memory shared between two processes survives checkpointing both (tests/cann/ipc_carry.c):
the exporter is refused while its importer runs; the importer is checkpointed first, then the
exporter; the daemon restarts; the exporter is restored, then the importer, which imports the
same keys again at its old addresses. Both outputs equal an uninterrupted run's, bit for bit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import StepGate, Workload, npusnap, npusnap_cmd, pid_alive, requires_criu

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, SLEEP_MS = 30, 60


def _fifos(d: Path) -> None:
    d.mkdir()
    for name in ("a2b", "b2a"):
        os.mkfifo(d / name)


def _output(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


def _reference(exe: Path, d: Path, env: dict) -> dict[str, list[str]]:
    _fifos(d)
    procs = {role: subprocess.Popen([str(exe), role, str(d), str(STEPS), "0"], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
             for role in "ab"}  # fmt: skip
    out = {}
    try:
        for role, p in procs.items():
            text, _ = p.communicate(timeout=60)
            assert p.returncode == 0, text[-2000:]
            out[role] = _output(text.splitlines())
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_sharing_is_carried_when_both_sides_are_checkpointed(npusim_daemon, build_c, tmp_path) -> None:
    exe = build_c("ipc_carry")
    env = npusim_daemon.env
    expected = _reference(exe, tmp_path / "ref", env)
    assert expected["a"][-1] == "A done" and expected["b"][-1] == "B done"

    d = tmp_path / "run"
    _fifos(d)
    gate = StepGate(tmp_path / "gate", STEPS - 2)  # holds B (A waits for B's end anyway)
    sides = {role: Workload([*npusnap_cmd(), "run", "--", str(exe), role, str(d), str(STEPS), str(SLEEP_MS)],
                            tmp_path / f"{role}.out", env={**env, **gate.env}) for role in "ab"}
    try:
        a, b = sides["a"], sides["b"]
        b.wait_for_line("B step 3 ", timeout=60)

        r = npusnap("checkpoint", a.pid, "-D", tmp_path / "ck-a-early", env=env, timeout=120)
        assert r.returncode == 9 and "507906" in r.stderr, r.stderr  # its importer still runs
        assert "cannot carry" in r.stderr and "ipc memory" in r.stderr, r.stderr  # the runtime names it
        assert pid_alive(a.pid) and not (tmp_path / "ck-a-early").exists()

        r = npusnap("checkpoint", b.pid, "-D", tmp_path / "ck-b", env=env, timeout=120)
        assert r.returncode == 0, r.stderr  # the importer first
        b.wait_exit(timeout=10)
        a.wait_for_line("A step 20 ", timeout=60)  # the exporter runs on alone
        r = npusnap("checkpoint", a.pid, "-D", tmp_path / "ck-a", env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        a.wait_exit(timeout=10)

        npusim_daemon.restart()  # no trace of either on the device
        gate.open()
        for role in "ab":  # the exporter first; --detach: A waits for B, so a foreground restore of A would too
            rs = npusnap("restore", "--detach", tmp_path / f"ck-{role}", env=env, timeout=120)
            assert rs.returncode == 0, f"{role}: {rs.stderr}"
        for w in (a, b):
            w.wait_for_line(" done", timeout=60)
        assert _output(a.lines()) == expected["a"]
        assert _output(b.lines()) == expected["b"]
    finally:
        for w in sides.values():
            w.stop()
