"""The checkpoint pipeline's steps and undos, each failure point and a signal at each step,
with a fake backend and a fake CRIU around a real process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from npusnap_cli.backends import DataPath, State
from npusnap_cli.core import checkpoint as pipeline
from npusnap_cli.core.checkpoint import CheckpointOptions
from npusnap_cli.core.progress import Event, Level, Message, PhaseFinished, PhaseStarted
from npusnap_cli.errors import CriuFailed, DeviceFailed, Interrupted, LeaseLost, StorageProblem, WrongState
from npusnap_cli.image.format import load_manifest, verify
from tests.helpers import proc_state, running

from .fakes import Fakes, fail


def _run(fakes: Fakes, pid: int, directory: Path, events: list[Event], **opts: object) -> object:
    return pipeline.checkpoint(pid, CheckpointOptions(directory=directory, **opts),  # type: ignore[arg-type]
                               progress=events.append, services=fakes.services())


def _warnings(events: list[Event]) -> list[str]:
    return [e.text for e in events if isinstance(e, Message) and e.level == Level.WARNING]


def _nothing_left(directory: Path) -> bool:
    """No checkpoint and no partial one beside it."""
    return not directory.exists() and not any(directory.parent.glob(f".{directory.name}.*"))


def _assert_rolled_back(fakes: Fakes, w: subprocess.Popen[bytes], directory: Path) -> None:
    assert running(w.pid), proc_state(w.pid)
    assert fakes.backend.current == State.RUNNING
    assert _nothing_left(directory)
    assert fakes.backend.released and fakes.guardians[0].released


def test_a_checkpoint_commits_then_kills_the_tree(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                  tmp_path: Path) -> None:
    events: list[Event] = []
    m = _run(fakes, workload.pid, tmp_path / "ck", events)
    assert proc_state(workload.pid) in ("Z", "gone")  # killed, and only after the commit
    assert fakes.script.log == ["lock", "fence", "backup", "fence", "dump"]
    assert fakes.backend.current == State.BACKED_UP  # the device state went with the dump
    manifest = verify(tmp_path / "ck")
    assert manifest.device.bytes == fakes.backend.nbytes and [p.pid for p in manifest.processes] == [workload.pid]
    assert [p.name for p in manifest.phases] == ["lock", "backup", "dump", "seal"]
    assert [e.name for e in events if isinstance(e, PhaseStarted)] == ["lock", "backup", "dump", "seal"]
    assert [e.name for e in events if isinstance(e, PhaseFinished)] == ["lock", "backup", "dump", "seal"]
    assert m == load_manifest(tmp_path / "ck") and _warnings(events) == []


def test_leave_running_resumes_restores_and_unlocks(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                    tmp_path: Path) -> None:
    _run(fakes, workload.pid, tmp_path / "ck", [], leave_running=True)
    assert running(workload.pid)
    assert fakes.backend.current == State.RUNNING and fakes.script.log[-2:] == ["restore", "unlock"]
    assert fakes.criu.network_lock_released == [tmp_path / "ck" / "criu"]  # from the committed directory
    verify(tmp_path / "ck")


@pytest.mark.parametrize("call, error", [
    ("lock", DeviceFailed), ("backup", DeviceFailed), ("dump", CriuFailed), ("fence", LeaseLost),
])
def test_a_failed_step_undoes_every_step_before_it(call: str, error: type[Exception], fakes: Fakes,
                                                  workload: subprocess.Popen[bytes], tmp_path: Path) -> None:
    fakes.script.fail = fail(call, error)
    events: list[Event] = []
    with pytest.raises(error):
        _run(fakes, workload.pid, tmp_path / "ck", events)
    _assert_rolled_back(fakes, workload, tmp_path / "ck")
    assert _warnings(events) == []


def test_a_failed_commit_undoes_everything_and_keeps_what_took_its_place(
        fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path) -> None:
    planted = tmp_path / "ck"
    fakes.criu.on_dump = lambda: planted.write_text("not a checkpoint")  # -D changes under us
    with pytest.raises(StorageProblem):
        _run(fakes, workload.pid, planted, [])
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
    assert planted.read_text() == "not a checkpoint"
    assert not any(tmp_path.glob(".ck.*"))


@pytest.mark.parametrize("call", ["lock", "backup"])
def test_a_signal_as_a_device_step_returns_rolls_back(call: str, fakes: Fakes, workload: subprocess.Popen[bytes],
                                                     tmp_path: Path) -> None:
    fakes.script.interrupt = {call}
    with pytest.raises(Interrupted):
        _run(fakes, workload.pid, tmp_path / "ck", [])
    _assert_rolled_back(fakes, workload, tmp_path / "ck")


def test_a_signal_during_the_dump_waits_for_it_then_rolls_back(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                              tmp_path: Path) -> None:
    fakes.script.interrupt = {"dump"}
    with pytest.raises(Interrupted):
        _run(fakes, workload.pid, tmp_path / "ck", [])
    assert "dump" in fakes.script.log  # CRIU was not interrupted: the signal was held until it returned
    _assert_rolled_back(fakes, workload, tmp_path / "ck")


@pytest.mark.parametrize("phase", ["lock", "backup", "dump", "seal"])
def test_a_signal_as_each_phase_starts_rolls_back(phase: str, fakes: Fakes, workload: subprocess.Popen[bytes],
                                                 tmp_path: Path) -> None:
    import os
    import signal

    def progress(event: Event) -> None:
        if event == PhaseStarted(phase):
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        pipeline.checkpoint(workload.pid, CheckpointOptions(directory=tmp_path / "ck"), progress=progress,
                            services=fakes.services())
    _assert_rolled_back(fakes, workload, tmp_path / "ck")


def test_a_signal_at_the_commit_never_undoes_it(fakes: Fakes, workload: subprocess.Popen[bytes],
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    def pause(point: str, until: object = None) -> None:
        if point == "commit":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(pipeline.testhooks, "pause", pause)
    events: list[Event] = []
    _run(fakes, workload.pid, tmp_path / "ck", events, leave_running=True)
    verify(tmp_path / "ck")
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
    assert _warnings(events) == ["interrupt received after the checkpoint was committed: finishing it"]


def test_one_failed_undo_does_not_strand_the_others(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                   tmp_path: Path) -> None:
    fakes.script.fail = {**fail("dump", CriuFailed), **fail("back_to_running")}
    events: list[Event] = []
    with pytest.raises(CriuFailed):
        _run(fakes, workload.pid, tmp_path / "ck", events)
    assert running(workload.pid) and _nothing_left(tmp_path / "ck")  # resumed and cleaned up all the same
    assert _warnings(events) == ["rollback: device rollback failed: fake back_to_running failed"]


def test_direct_path_rollback_puts_the_device_data_back_then_discards_it(
        fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path) -> None:
    fakes.backend.method = DataPath.DIRECT
    fakes.script.fail = fail("dump", CriuFailed)
    with pytest.raises(CriuFailed):
        _run(fakes, workload.pid, tmp_path / "ck", [])
    _assert_rolled_back(fakes, workload, tmp_path / "ck")
    # Armed right after the lock, before the device data exists only in the staging directory.
    assert fakes.guardians[0].said == ["recover", f"watch [{workload.pid}]"]  # the dump failed: no second watch


def test_direct_path_keeps_the_only_copy_when_the_device_rollback_fails(
        fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path) -> None:
    fakes.backend.method = DataPath.DIRECT
    fakes.script.fail = {**fail("dump", CriuFailed), **fail("back_to_running")}
    events: list[Event] = []
    with pytest.raises(CriuFailed):
        _run(fakes, workload.pid, tmp_path / "ck", events)
    [kept] = tmp_path.glob(".ck.partial-*")
    assert (kept / "device" / "dev0.img").stat().st_size == fakes.backend.nbytes
    assert not (kept / "manifest.yaml").exists()  # it never looks like a checkpoint
    assert any("stays in" in w for w in _warnings(events))


def test_a_process_not_running_is_refused_before_anything(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                         tmp_path: Path) -> None:
    fakes.backend.current = State.LOCKED
    with pytest.raises(WrongState, match="not RUNNING"):
        _run(fakes, workload.pid, tmp_path / "ck", [])
    assert fakes.script.log == [] and fakes.guardians == [] and _nothing_left(tmp_path / "ck")


def test_the_runbook_dump_leaves_the_device_backed_up(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                     tmp_path: Path) -> None:
    fakes.backend.current = State.BACKED_UP
    m = pipeline.dump(workload.pid, CheckpointOptions(directory=tmp_path / "ck", leave_running=True),
                      services=fakes.services())
    assert running(workload.pid) and fakes.backend.current == State.BACKED_UP
    assert fakes.script.log == ["fence", "dump"] and [p.name for p in m.phases] == ["dump", "seal"]
    assert m.device.bytes == fakes.backend.nbytes


def test_the_runbook_dump_refuses_a_device_not_backed_up(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                        tmp_path: Path) -> None:
    with pytest.raises(WrongState, match="not backed up"):
        pipeline.dump(workload.pid, CheckpointOptions(directory=tmp_path / "ck"), services=fakes.services())
    assert fakes.script.log == [] and running(workload.pid)


def test_a_failed_runbook_dump_resumes_the_process_still_backed_up(
        fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path) -> None:
    fakes.backend.current = State.BACKED_UP
    fakes.script.fail = fail("dump", CriuFailed)
    with pytest.raises(CriuFailed):
        pipeline.dump(workload.pid, CheckpointOptions(directory=tmp_path / "ck"), services=fakes.services())
    assert running(workload.pid) and fakes.backend.current == State.BACKED_UP
    assert _nothing_left(tmp_path / "ck")


@pytest.mark.parametrize("after", [0, 1, 4])
def test_a_ctrl_c_while_the_staging_is_made_leaves_nothing(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          after: int) -> None:
    # The CLI's own handler raises KeyboardInterrupt between any two of the directories the staging
    # makes (before, its cleanup was registered only once all of them existed: the partial stayed).
    import os as os_mod

    from npusnap_cli.image import staging

    made = []
    real = os_mod.mkdir

    def mkdir(path: object, mode: int = 0o777) -> None:
        if len(made) == after:
            raise KeyboardInterrupt
        real(path, mode)  # type: ignore[arg-type]
        made.append(path)

    monkeypatch.setattr(staging.os, "mkdir", mkdir)
    with pytest.raises(KeyboardInterrupt):
        _run(fakes, workload.pid, tmp_path / "ck", [])
    assert len(made) == after and _nothing_left(tmp_path / "ck")
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
