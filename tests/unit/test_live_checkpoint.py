"""The live checkpoint's steps (`checkpoint --live`): images staged in a tmpfs, the workload resumed
and unlocked before the write-behind, the seal and commit only after it; a failure or a signal
after the resume costs only the checkpoint; a staging that would not fit falls back to an
ordinary --leave-running checkpoint. Fake backend and CRIU around a real process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from npusnap_cli.backends import DataPath, State
from npusnap_cli.core import checkpoint as pipeline
from npusnap_cli.core.checkpoint import CheckpointOptions
from npusnap_cli.core.progress import Event, Level, Message
from npusnap_cli.errors import Interrupted, NpusnapError
from npusnap_cli.image import memstage
from npusnap_cli.image.format import load_manifest, verify
from tests.helpers import proc_state, running

from .fakes import Fakes


def _live(fakes: Fakes, pid: int, directory: Path, staging: Path, events: list[Event]) -> object:
    return pipeline.checkpoint(pid, CheckpointOptions(directory=directory, leave_running=True, live=True,
                                                      live_staging=staging),
                               progress=events.append, services=fakes.services())


def _warnings(events: list[Event]) -> list[str]:
    return [e.text for e in events if isinstance(e, Message) and e.level == Level.WARNING]


@pytest.mark.parametrize("method", [DataPath.IN_PROCESS, DataPath.DIRECT])
def test_the_workload_runs_on_before_the_write_behind(method: DataPath, fakes: Fakes,
                                                      workload: subprocess.Popen[bytes], tmp_path: Path,
                                                      shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes.backend.method = method
    seen: dict[str, object] = {}

    def fail(point: str) -> None:  # the write-behind's hook, after each file: what runs then
        if point == "during:write-behind" and not seen:
            seen.update(state=proc_state(workload.pid), device=fakes.backend.current,
                        staged=[p.name for p in shm.iterdir()], on_disk=(tmp_path / "ck").exists())

    monkeypatch.setattr(pipeline.testhooks, "fail", fail)
    events: list[Event] = []
    m = _live(fakes, workload.pid, tmp_path / "ck", shm, events)
    assert seen["state"] not in ("T", "t") and seen["device"] == State.RUNNING  # resumed and unlocked already
    assert len(seen["staged"]) == 1 and not seen["on_disk"]  # in memory, nothing looks like a checkpoint
    assert [p.name for p in m.phases] == ["lock", "backup", "dump", "resume", "write-behind", "seal"]
    assert 0 < m.options["live"]["downtime_s"]
    assert list(shm.iterdir()) == [] and _warnings(events) == []  # the memory was given back
    assert m == load_manifest(tmp_path / "ck") and verify(tmp_path / "ck")
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
    assert fakes.guardians[0].said[-2:] == ["resumed", "commit run"]  # nothing left to recover, then the commit


def test_a_failure_in_the_write_behind_leaves_it_running_and_no_checkpoint(
        fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path, shm: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUSNAP_TEST_FAIL", "during:write-behind")
    with pytest.raises(NpusnapError, match="injected"):
        _live(fakes, workload.pid, tmp_path / "ck", shm, [])
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
    assert fakes.script.log.count("restore") == 1  # restored once, at the resume; the rollback had nothing to do
    assert list(tmp_path.iterdir()) == [] and list(shm.iterdir()) == []


def test_a_signal_after_the_resume_costs_only_the_checkpoint(
        fakes: Fakes, workload: subprocess.Popen[bytes], tmp_path: Path, shm: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    def fail(point: str) -> None:
        if point == "during:write-behind":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(pipeline.testhooks, "fail", fail)
    with pytest.raises(Interrupted):
        _live(fakes, workload.pid, tmp_path / "ck", shm, [])
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
    assert list(tmp_path.iterdir()) == [] and list(shm.iterdir()) == []


def test_a_failed_dump_in_memory_rolls_back_as_ever(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                    tmp_path: Path, shm: Path) -> None:
    from npusnap_cli.errors import CriuFailed

    from .fakes import fail

    fakes.backend.method = DataPath.DIRECT
    fakes.script.fail = fail("dump", CriuFailed)
    with pytest.raises(CriuFailed):
        _live(fakes, workload.pid, tmp_path / "ck", shm, [])
    assert running(workload.pid) and fakes.backend.current == State.RUNNING
    assert list(tmp_path.iterdir()) == [] and list(shm.iterdir()) == []
    said = fakes.guardians[0].said  # if we die: the device recovered from the images in memory, then removed
    assert said[0].startswith(f"remove {shm}/npusnap-live-") and "recover" in said, said


def test_staging_that_would_not_fit_falls_back_with_one_warning(fakes: Fakes, workload: subprocess.Popen[bytes],
                                                                 tmp_path: Path) -> None:
    events: list[Event] = []
    m = _live(fakes, workload.pid, tmp_path / "ck", tmp_path, events)  # not a tmpfs
    assert _warnings(events) == [f"not live: {tmp_path} is not a tmpfs; the workload stays stopped for the "
                                 "whole checkpoint"]
    assert [p.name for p in m.phases] == ["lock", "backup", "dump", "seal"] and "live" not in m.options
    assert running(workload.pid)


def test_the_memory_bound(shm: Path) -> None:
    free = memstage.free_bytes(shm)
    assert memstage.why_not(shm, 1 << 20) is None
    problem = memstage.why_not(shm, free)
    assert problem is not None and problem.startswith("staging needs about") and "MiB free" in problem
    assert memstage.why_not(shm / "none", 1) is not None
