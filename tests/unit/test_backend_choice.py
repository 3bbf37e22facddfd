"""Choosing a backend, and the names and states the backends speak."""

from __future__ import annotations

import subprocess

import pytest

from npusnap_cli import backends
from npusnap_cli.backends import BackendName, DataPath, State
from npusnap_cli.backends.none import NoDevice
from npusnap_cli.errors import DeviceFailed, ImageInvalid, WrongState
from npusnap_cli.image.format import DeviceState


def test_a_process_without_agent_or_device_runtime_gets_none(workload: subprocess.Popen[bytes]) -> None:
    backend = backends.select(workload.pid, BackendName.AUTO, maps="")
    assert isinstance(backend, NoDevice) and backend.state() == State.RUNNING
    assert backend.describe() == DeviceState()


def test_a_device_runtime_without_the_agent_is_refused_with_the_fix(workload: subprocess.Popen[bytes]) -> None:
    with pytest.raises(WrongState, match="has no npusnap agent") as e:
        backends.select(workload.pid, BackendName.AUTO, maps="7f00-7f01 r-xp 0 0:1 2 /x/libascendcl.so\n")
    assert e.value.hint is not None and "npusnap attach" in e.value.hint
    with pytest.raises(WrongState):
        backends.select(workload.pid, BackendName.SIM, maps="")


def test_none_is_none_whatever_the_process(workload: subprocess.Popen[bytes]) -> None:
    assert isinstance(backends.select(workload.pid, BackendName.NONE, maps="/dev/nvidia0"), NoDevice)


def test_a_restore_refuses_a_backend_it_does_not_know() -> None:
    with pytest.raises(ImageInvalid, match="unknown device backend 'tpu'"):
        backends.for_restore(1, DeviceState(backend="tpu", method=DataPath.IN_PROCESS.value))
    with pytest.raises(WrongState, match="--device-map applies to cuda"):
        backends.for_restore(1, DeviceState(backend="sim"), {"GPU-a": "GPU-b"})


def test_an_unknown_agent_state_is_a_device_failure_not_a_traceback() -> None:
    assert State.parse("BACKED_UP") is State.BACKED_UP
    with pytest.raises(DeviceFailed, match="unknown state 'FROZEN'"):
        State.parse("FROZEN")


def test_the_names_are_the_manifest_strings() -> None:
    # The manifest and the agent's JSON carry these strings; the enums must compare equal to them.
    assert [b.value for b in BackendName] == list(backends.BACKENDS) == ["auto", "none", "sim", "ascend", "cuda"]
    assert DataPath.DIRECT == "direct" and State.RUNNING == "RUNNING" and str(DataPath.IN_PROCESS) == "in-process"
