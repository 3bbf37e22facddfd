"""The CLI dies (SIGKILL) at every phase boundary of `npusnap checkpoint`: the workload
must come back by itself within a bounded time (the agent's lease for the device, the
guardian for a stopped tree). And `npusnap recover PID` brings it back from each
intermediate state."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from npusnap_cli.core.checkpoint import CheckpointOptions
from tests.helpers import npusnap

from .conftest import NOTES
from .support import (
    PausedCli,
    assert_failed_cleanly,
    assert_no_valid_checkpoint,
    assert_running_intact,
    proc_state,
    start_train,
    wait_recovers,
)

LEASE = CheckpointOptions(directory=None).lease  # type: ignore[arg-type]
SHORT_LEASE = 3  # where only the lease brings the workload back (locked, no guardian's work): waited for

POINTS = [
    "before:lock",
    "after:lock",
    "before:backup",
    "after:backup",
    "before:dump",
    "after:dump",
    "before:seal",
    "after:seal",
]


@pytest.mark.parametrize("point", POINTS)
def test_cli_sigkilled_at_phase_boundary(point, npusim_daemon, reference, tmp_path):
    w = start_train(tmp_path, npusim_daemon.env)
    target = tmp_path / "ckpt"
    cli = None
    try:
        lease = SHORT_LEASE if point == "after:lock" else LEASE
        cli = PausedCli(["checkpoint", w.pid, "-D", target, "--lease", lease], point, npusim_daemon.env)
        cli.kill()
        bound = lease + 10  # the lease in run time, plus slack for the guardian and the restore
        wait_recovers(w, bound=bound, env=npusim_daemon.env)
        assert_running_intact(w, reference, npusim_daemon.env)
        left = assert_no_valid_checkpoint(target, partial_ok=True)
        if left:
            NOTES.append(f"SIGKILL at {point}: staging directory left behind ({left[0].name}); "
                         "`npusnap prune` removes it after an hour")
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        w.stop()


def test_cli_sigkilled_while_packing_leaves_the_store_usable(npusim_daemon, reference, tmp_path):
    """--dedup: the CLI killed after its pack got its first chunk, before the pack was indexed. The
    workload comes back; the next checkpoint into the same store neither finds nor references
    what the dead run stored, verifies, and prune deletes the dead run's pack."""
    w = start_train(tmp_path, npusim_daemon.env)
    store = tmp_path / ".npusnap-store" / "packs"
    try:
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck1", "--dedup", "--leave-running", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        indexed = {p.stem for p in store.glob("*.idx")}
        cli = PausedCli(["checkpoint", w.pid, "-D", tmp_path / "ck2", "--dedup", "--lease", LEASE], "pack",
                        npusim_daemon.env)
        cli.kill()
        wait_recovers(w, bound=LEASE + 10, env=npusim_daemon.env)
        assert_running_intact(w, reference, npusim_daemon.env)
        assert_no_valid_checkpoint(tmp_path / "ck2", partial_ok=True)
        dead = [p for p in store.glob("*.pack") if p.stem not in indexed]
        assert len(dead) == 1 and not dead[0].with_suffix(".idx").exists(), sorted(store.iterdir())
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck3", "--dedup", "--leave-running", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        assert npusnap("verify", tmp_path / "ck3", env=npusim_daemon.env).returncode == 0
        r = npusnap("prune", tmp_path, "--keep", "2", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        assert not dead[0].exists()
        for ck in ("ck1", "ck3"):
            assert npusnap("verify", tmp_path / ck, env=npusim_daemon.env).returncode == 0, ck
    finally:
        w.stop()


def _runbook(pid: int, env: dict, *cmds: str) -> None:
    for c in cmds:
        r = npusnap(c, pid, env=env, timeout=60)
        assert r.returncode == 0, (c, r.stderr)


@pytest.mark.parametrize("state", ["stopped", "LOCKED", "BACKED_UP", "BACKED_UP+stopped"])
def test_recover_from_intermediate_state(state, npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    try:
        if "LOCKED" in state:
            _runbook(w.pid, env, "lock")
        if "BACKED_UP" in state:
            _runbook(w.pid, env, "lock", "backup")
        if "stopped" in state:
            import os

            os.kill(w.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 5
            while proc_state(w.pid) not in ("T", "t"):
                assert time.monotonic() < deadline
                time.sleep(0.02)
        r = npusnap("recover", w.pid, "--json", env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert_running_intact(w, reference, env)
    finally:
        w.stop()


@pytest.mark.parametrize("point", [
    "after:lock",
    "after:backup",  # the restore undo is registered late too, but npusim's Unlock restores first
    "after:dump",
])
def test_interrupt_at_phase_end_rolls_back(point, npusim_daemon, reference, tmp_path):
    """Ctrl-C right at the end of a phase: the undo of that phase must run too."""
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    cli = None
    try:
        cli = PausedCli(["checkpoint", w.pid, "-D", target], point, env)
        cli.proc.send_signal(signal.SIGINT)
        out, err = cli.proc.communicate(timeout=60)
        r = subprocess.CompletedProcess(cli.proc.args, cli.proc.returncode, out.decode(), cli.stderr + err.decode())
        assert_failed_cleanly(r, {130})
        assert_no_valid_checkpoint(target)
        assert_running_intact(w, reference, env)
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        w.stop()
