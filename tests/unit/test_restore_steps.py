"""The restore pipeline's steps: a failure or a signal anywhere before the unlock kills what CRIU
restored (the checkpoint stays restorable); the unlock is the commit point."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from npusnap_cli.backends import State
from npusnap_cli.core import checkpoint as pipeline
from npusnap_cli.core import restore as restoring
from npusnap_cli.core.checkpoint import CheckpointOptions
from npusnap_cli.core.progress import Event, Level, Message, PhaseStarted
from npusnap_cli.core.restore import RestoreOptions
from npusnap_cli.errors import CriuFailed, DeviceFailed, ImageInvalid, Interrupted
from npusnap_cli.image.format import verify
from tests.helpers import proc_state, running

from .fakes import FakeBackend, Fakes, fail


@pytest.fixture
def checkpointed(fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path) -> Path:
    """A real checkpoint directory of the workload (killed after the commit), written with the fakes."""
    pipeline.checkpoint(workload.pid, CheckpointOptions(directory=tmp_path / "ck"), services=fakes.services())
    workload.wait(timeout=10)
    fakes.script.log.clear()
    fakes.restore_backend = FakeBackend(fakes.script, State.BACKED_UP)  # as CRIU brings the process back
    return tmp_path / "ck"


def _restore(fakes: Fakes, directory: Path, events: list[Event], **opts: object) -> restoring.RestoreResult:
    return restoring.restore(RestoreOptions(directory, **opts), progress=events.append,  # type: ignore[arg-type]
                             services=fakes.services())


def _restored_pid(fakes: Fakes) -> int:
    [proc] = fakes.criu.restored
    return proc.pid


def _killed(proc: subprocess.Popen[bytes]) -> bool:
    """Dead by the time the pipeline returned (it waits for the kill; it may have reaped it too)."""
    return proc_state(proc.pid) in ("Z", "gone")


def test_a_restore_brings_the_device_back_and_unlocks(fakes: Fakes, checkpointed: Path) -> None:
    result = _restore(fakes, checkpointed, [])
    assert result.pid == _restored_pid(fakes) and running(result.pid)
    assert fakes.script.log == ["criu-restore", "adopt_lease", "restore", "unlock"]
    assert [p.name for p in result.phases] == ["verify", "criu-restore", "device-restore", "unlock"]
    assert fakes.restore_backend is not None and fakes.restore_backend.current == State.RUNNING
    assert fakes.guardians[-1].released
    verify(checkpointed)  # restoring does not alter the checkpoint


def test_criu_only_leaves_the_device_phases_to_the_runbook(fakes: Fakes, checkpointed: Path) -> None:
    result = _restore(fakes, checkpointed, [], criu_only=True)
    assert running(result.pid) and fakes.script.log == ["criu-restore"]
    assert fakes.restore_backend is not None and fakes.restore_backend.current == State.BACKED_UP


@pytest.mark.parametrize("call, error", [
    ("criu-restore", CriuFailed), ("restore", DeviceFailed), ("unlock", DeviceFailed),
])
def test_a_failed_step_kills_what_was_restored(call: str, error: type[Exception], fakes: Fakes,
                                              checkpointed: Path) -> None:
    fakes.script.fail = fail(call, error)
    with pytest.raises(error):
        _restore(fakes, checkpointed, [])
    assert all(_killed(proc) for proc in fakes.criu.restored)
    assert fakes.guardians[-1].released
    verify(checkpointed)  # still valid: it can be restored again


@pytest.mark.parametrize("call", ["criu-restore", "restore"])
def test_a_signal_before_the_unlock_kills_what_was_restored(call: str, fakes: Fakes, checkpointed: Path) -> None:
    fakes.script.interrupt = {call}
    with pytest.raises(Interrupted):
        _restore(fakes, checkpointed, [])
    assert _killed(fakes.criu.restored[0])
    assert "criu-restore" in fakes.script.log  # CRIU itself was not interrupted: the signal waited


def test_a_signal_at_the_unlock_lets_the_restore_stand(fakes: Fakes, checkpointed: Path) -> None:
    fakes.script.interrupt = {"unlock"}
    result = _restore(fakes, checkpointed, [])
    assert running(result.pid)
    assert fakes.restore_backend is not None and fakes.restore_backend.current == State.RUNNING


@pytest.mark.parametrize("phase", ["verify", "criu-restore", "device-restore"])
def test_a_signal_as_each_phase_starts(phase: str, fakes: Fakes, checkpointed: Path) -> None:
    def progress(event: Event) -> None:
        if event == PhaseStarted(phase):
            os.kill(os.getpid(), signal.SIGINT)

    # verify runs before any handler of ours: the interrupt is Python's own there (the checkpoint
    # made by the fixture left its settled handler installed, as it does until a CLI exits)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt if phase == "verify" else Interrupted):
        restoring.restore(RestoreOptions(checkpointed), progress=progress, services=fakes.services())
    assert all(_killed(proc) for proc in fakes.criu.restored)


def test_an_agent_that_finished_by_itself_is_left_alone(fakes: Fakes, checkpointed: Path) -> None:
    fakes.restore_backend = FakeBackend(fakes.script, State.RUNNING)  # its lease ran out while we were stopped
    events: list[Event] = []
    result = _restore(fakes, checkpointed, events)
    assert running(result.pid) and fakes.script.log == ["criu-restore", "adopt_lease"]
    assert [e.text for e in events if isinstance(e, Message) and e.level == Level.WARNING] == [
        f"process {result.pid}'s agent finished the device restore by itself (npusnap was stopped)"]


def test_a_corrupt_checkpoint_is_refused_before_criu(fakes: Fakes, checkpointed: Path) -> None:
    image = checkpointed / "criu" / "pstree.img"  # what CRIU parses: checked before it runs
    image.write_bytes(b"\0" * image.stat().st_size)
    with pytest.raises(ImageInvalid):
        _restore(fakes, checkpointed, [])
    assert fakes.script.log == [] and fakes.guardians[-1:] == fakes.guardians[:1]  # no restore guardian


def test_a_corrupt_page_image_is_refused_before_the_process_runs(fakes: Fakes, checkpointed: Path) -> None:
    """Page images are verified while CRIU reads them; CRIU leaves the tree stopped until they match."""
    image = checkpointed / "criu" / "pages-1.img"
    image.write_bytes(b"\0" * image.stat().st_size)
    with pytest.raises(ImageInvalid, match="pages-1.img: checksum mismatch"):
        _restore(fakes, checkpointed, [])
    [proc] = fakes.criu.restored
    assert _killed(proc) and fakes.script.log == ["criu-restore"]
    assert not (checkpointed.parent / "ran").exists()  # stopped from its start to its death


def test_good_page_images_resume_the_stopped_tree(fakes: Fakes, checkpointed: Path) -> None:
    result = _restore(fakes, checkpointed, [])
    assert running(result.pid) and proc_state(result.pid) not in ("T", "t")
    deadline = time.monotonic() + 30  # a bound, not a timing assertion: it runs once resumed
    while not (checkpointed.parent / "ran").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (checkpointed.parent / "ran").exists()


def test_no_verify_leaves_nothing_stopped(fakes: Fakes, checkpointed: Path) -> None:
    result = _restore(fakes, checkpointed, [], verify=False)
    assert running(result.pid) and proc_state(result.pid) not in ("T", "t")


def test_a_pid_in_use_is_refused_before_criu(fakes: Fakes, workload: subprocess.Popen[bytes],
                                             tmp_path: Path) -> None:
    pipeline.checkpoint(workload.pid, CheckpointOptions(directory=tmp_path / "ck", leave_running=True),
                        services=fakes.services())
    fakes.script.log.clear()
    with pytest.raises(CriuFailed, match=f"pid {workload.pid} from the checkpoint is in use"):
        _restore(fakes, tmp_path / "ck", [])
    assert fakes.script.log == [] and proc_state(workload.pid) != "gone"
