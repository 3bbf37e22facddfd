"""Checkpoint/restore with every kernel resource live (tests/cann/kernel_steps.c): a binary whose
file is gone, its functions, an argument handle with a placeholder, a captured model run instance
and the operator API's binary. Checkpoint mid-run, kill, restart the daemon, restore: the output
is bit-identical to an uninterrupted run's."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import StepGate, Workload, agent_status, requires_criu
from tests.pipeline.support import checkpoint_and_restore_after_daemon_restart, under_agent

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
