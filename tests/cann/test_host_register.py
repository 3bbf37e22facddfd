"""Host registration (tests/cann/host_register_steps.c): registered host memory is reached in place
by the device through its device pointer (device reads see host writes, device writes show in host
memory), CANN's codes for overlapping, unknown and IO-memory registrations, and a registration
still shared with the device after a real checkpoint, a daemon restart and a restore: the output
is bit-identical to an uninterrupted run's."""

from __future__ import annotations

import pytest

from tests.cann.steps import checkpoint_mid_run, reference
from tests.helpers import requires_criu

STEPS, SLEEP_MS = 12, 60


def test_registered_memory_is_shared_in_place(npusim_daemon, build_c) -> None:
    out = reference(npusim_daemon, build_c("host_register_steps"), STEPS)
    assert out[0] == "kept 1"  # registering keeps the content
    # A page registered already (also through another range): ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    # not registered: ACL_ERROR_HOST_MEMORY_NOT_REGISTERED; IO memory: ACL_ERROR_RT_FEATURE_NOT_SUPPORT.
    assert out[1] == "errors again 507910 inner 507910 lookup 507911 unreg 507911 io 207000 flag 100000"
    steps = [line.split() for line in out if line.startswith("step ")]
    assert len(steps) == STEPS
    for i, words in enumerate(steps):
        # The device's memset through the device pointer is in host memory; its write through the
        # unaligned registration's pointer too.
        assert words[7] == f"{0xC0 + i:02x}" and words[-1] == "zeroXcopy", words
    assert out[-2:] == ["unregistered kept 1 lookup 507911", "done"]


@requires_criu
@pytest.mark.criu
def test_registration_survives_checkpoint_and_daemon_restart(npusim_daemon, build_c, tmp_path) -> None:
    exe = build_c("host_register_steps")
    checkpoint_mid_run(npusim_daemon, exe, STEPS, SLEEP_MS, "step 2 ", reference(npusim_daemon, exe, STEPS), tmp_path)
