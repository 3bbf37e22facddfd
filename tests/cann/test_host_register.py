"""Host registration (tests/cann/host_register_steps.c): registered host memory is reached in place
by the device through its device pointer (device reads see host writes, device writes show in host
memory), CANN's codes for overlapping, unknown and IO-memory registrations, and a registration
still shared with the device after a real checkpoint, a daemon restart and a restore: the output
is bit-identical to an uninterrupted run's."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import Workload, npusnap, npusnap_cmd, requires_criu

STEPS, SLEEP_MS = 12, 60


def _output(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


@pytest.fixture
def reference_run(npusim_daemon, build_c) -> list[str]:
    """The program's output, uninterrupted."""
    ref = subprocess.run([str(build_c("host_register_steps")), str(STEPS), "0"], env=npusim_daemon.env,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    return _output(ref.stdout.splitlines())


def test_registered_memory_is_shared_in_place(reference_run) -> None:
    assert reference_run[0] == "kept 1"  # registering keeps the content
    # A page registered already (also through another range): ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    # not registered: ACL_ERROR_HOST_MEMORY_NOT_REGISTERED; IO memory: ACL_ERROR_RT_FEATURE_NOT_SUPPORT.
    assert reference_run[1] == "errors again 507910 inner 507910 lookup 507911 unreg 507911 io 207000 flag 100000"
    steps = [line.split() for line in reference_run if line.startswith("step ")]
    assert len(steps) == STEPS
    for i, words in enumerate(steps):
        # The device's memset through the device pointer is in host memory; its write through the
        # unaligned registration's pointer too.
        assert words[7] == f"{0xC0 + i:02x}" and words[-1] == "zeroXcopy", words
    assert reference_run[-2:] == ["unregistered kept 1 lookup 507911", "done"]


@requires_criu
@pytest.mark.criu
def test_registration_survives_checkpoint_and_daemon_restart(npusim_daemon, build_c, reference_run, tmp_path) -> None:
    w = Workload([*npusnap_cmd(), "run", "--", str(build_c("host_register_steps")), str(STEPS), str(SLEEP_MS)],
                 tmp_path / "out", env=npusim_daemon.env)
    try:
        w.wait_for_line("step 2 ", timeout=30)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, env=npusim_daemon.env, timeout=120)
        assert r.returncode == 0, r.stderr
        at_checkpoint = _output(w.lines())
        assert at_checkpoint == reference_run[: len(at_checkpoint)] and len(at_checkpoint) < len(reference_run)
        w.wait_exit(timeout=10)

        npusim_daemon.restart()  # nothing of the process is left on the device
        rs = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        w.wait_for_line("done", timeout=60)
        assert _output(w.lines()) == reference_run
    finally:
        w.stop()
