"""Checkpoint/restore with every kernel resource live (tests/cann/kernel_steps.c): a binary whose
file is gone, its functions, an argument handle with a placeholder, a captured model run instance
and the operator API's binary. Checkpoint mid-run, kill, restart the daemon, restore: the output
is bit-identical to an uninterrupted run's."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.helpers import StepGate, Workload, agent_status, npusnap, npusnap_cmd, requires_criu, rewind_to_checkpoint
from tests.pipeline.support import checkpoint_and_restore_after_daemon_restart, strip_ready, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 40, 5, 20


def test_kernel_resources_survive_checkpoint_daemon_restart_restore(npusim_daemon, cann_program, kernels_so,
                                                                     reference, tmp_path) -> None:
    exe = cann_program("kernel_steps.c", "-lascendcl", "-lnnopbase", "-lopapi")
    ref_copy = tmp_path / "ref_kernels.so"  # each run deletes its copy once loaded
    shutil.copy(kernels_so, ref_copy)
    ref = reference([str(exe), str(STEPS), "0", str(ref_copy)])
    assert len(ref) == STEPS + 1

    binary = tmp_path / "kernels.so"
    shutil.copy(kernels_so, binary)
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent([str(exe), str(STEPS), str(SLEEP_MS), str(binary)]), tmp_path / "steps.out",
                 env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        assert not binary.exists()  # restore must bring the binary back from the process's own copy
        device = agent_status(w.pid, npusim_daemon.env)["device"]
        live = {kind: n for kind, n in device["resources"].items() if n}
        assert live == {"memory": 5, "contexts": 1, "streams": 3, "binaries": 2, "functions": 3, "kernel args": 1,
                        "model run instances": 1}, device

        checkpoint_and_restore_after_daemon_restart(w, npusim_daemon, ref, AT, tmp_path / "ck", gate)
    finally:
        w.stop()


def test_a_live_checkpoint_holds_the_snapshot_while_its_kernels_run_on(npusim_daemon, cann_program, kernels_so,
                                                                       reference, tmp_path, shm) -> None:
    """--live while the workload's kernels (its kernel runner writes device memory through shared
    mappings the daemon cannot watch) run on, held before the write-behind: the images hold the
    memory of the snapshot (tests/cann/kernel_state.c accumulates, so a byte written after it shows
    in every later line). The workload is killed once it ran on, the daemon restarted, the
    checkpoint restored: the output is an uninterrupted run's."""
    exe = cann_program("kernel_state.c", "-lascendcl")
    ref = reference([str(exe), str(STEPS), "0", str(kernels_so)])
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent([str(exe), str(STEPS), str(SLEEP_MS), str(kernels_so)]), tmp_path / "steps.out",
                 env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        ck, go, err = tmp_path / "ck", tmp_path / "go", tmp_path / "ck.err"
        with open(err, "w") as e:  # held before the write-behind while the kernels run on
            cli = subprocess.Popen([*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(ck), "--live",
                                    "--live-staging", str(shm), "--data-path", "direct"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=e,
                                   env={**npusim_daemon.env, "NPUSNAP_TEST_PAUSE": "before:write-behind",
                                        "NPUSNAP_TEST_PAUSE_UNTIL": str(go), "NPUSNAP_TEST_PAUSE_S": "120"})
        try:
            deadline = time.monotonic() + 120
            while "test pause before:write-behind" not in err.read_text() and cli.poll() is None:
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.05)
            resumed_at = len(strip_ready(w.lines()))
            w.wait_for_line(f"step {resumed_at + 3} ", timeout=60)  # ran on, its kernels rewriting its memory
            go.touch()
            assert cli.wait(timeout=120) == 0, err.read_text()
        finally:
            if cli.poll() is None:
                cli.kill()
            cli.wait()
        w.stop()
        rewind_to_checkpoint(ck, w.out)
        npusim_daemon.restart()
        gate.open()
        rs = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        w.wait_exit(timeout=60)
        assert strip_ready(w.lines()) == list(ref)
    finally:
        w.stop()
