"""A process set's live checkpoint (`checkpoint PID PID --live`, core/processset.py) with fake
backends and a fake CRIU around real processes: every member's images staged in one tmpfs
directory, every member resumed and unlocked before the write-behind, one seal and one commit after
it; the room check counts the whole set; a failure or signal at any step leaves every member
running, unlocked, and nothing behind (tests/pipeline/test_live_set.py runs it for real)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from npusnap_cli.backends import State
from npusnap_cli.core import checkpoint as pipeline
from npusnap_cli.core.checkpoint import CheckpointRun
from npusnap_cli.core.progress import Event, Level, Message
from npusnap_cli.errors import CriuFailed, Interrupted, NpusnapError
from npusnap_cli.image import memstage
from npusnap_cli.image.format import load_manifest, verify
from npusnap_cli.platform.criu import DumpOptions
from tests.helpers import proc_state, running

from .test_processset import N, SetFakes, _assert_all_undone, _checkpoint, _sleeper

MiB = 1 << 20


@pytest.fixture
def members() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [_sleeper() for _ in range(N)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait()


@pytest.fixture
def fakes(members: list[subprocess.Popen[bytes]]) -> Iterator[SetFakes]:
    f = SetFakes()
    for p in members:
        f.add(p.pid)
    try:
        yield f
    finally:
        f.criu.reap()


def _live(fakes: SetFakes, members: list[subprocess.Popen[bytes]], directory: Path, staging: Path,
          events: list[Event]) -> object:
    return _checkpoint(fakes, members, directory, events, leave_running=True, live=True, live_staging=staging)


def _warnings(events: list[Event]) -> list[str]:
    return [e.text for e in events if isinstance(e, Message) and e.level == Level.WARNING]


def test_every_member_runs_on_before_the_write_behind(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                                      tmp_path: Path, shm: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fail(point: str, once: bool = False) -> None:  # the write-behind's hook, after each file: what runs then
        if point == "during:write-behind" and not seen:
            seen.update(states=[proc_state(p.pid) for p in members],
                        devices=[fakes.backends[p.pid].current for p in members],
                        staged=[p.name for p in shm.iterdir()], on_disk=(tmp_path / "ck").exists())

    monkeypatch.setattr(pipeline.testhooks, "fail", fail)
    events: list[Event] = []
    m = _live(fakes, members, tmp_path / "ck", shm, events)
    assert not any(s in ("T", "t") for s in seen["states"])  # type: ignore[attr-defined]
    assert seen["devices"] == [State.RUNNING] * N  # every member resumed and unlocked already
    assert len(seen["staged"]) == 1 and not seen["on_disk"]  # one directory in memory for the set
    assert [p.name for p in m.phases] == ["lock", "backup", "dump", "resume", "write-behind", "seal"]
    assert m.options["live"]["downtime_s"] > 0
    assert all([p.name for p in e.phases].count("resume") == 1 for e in m.members)  # once: not again after the commit
    assert list(shm.iterdir()) == [] and _warnings(events) == []  # the memory was given back
    assert m == load_manifest(tmp_path / "ck") and verify(tmp_path / "ck")
    for p in members:
        assert running(p.pid) and fakes.backends[p.pid].current == State.RUNNING
    said = fakes.guardians[0].said
    assert said[0].startswith(f"remove {shm}/npusnap-live-")  # told before any lock
    assert said[-2:] == ["resumed", "commit run"] and said.count("resumed") == 1


def test_the_room_check_counts_the_whole_set(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                             tmp_path: Path, shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each member alone would fit (400 MiB of images in 1 GiB), the set's three do not: an
    ordinary --leave-running set checkpoint, with one process's warning."""
    monkeypatch.setattr(CheckpointRun, "live_need", lambda self: (300 * MiB, 100 * MiB))
    monkeypatch.setattr(memstage, "free_bytes", lambda directory: 1024 * MiB)
    assert memstage.why_not(shm, 400 * MiB) is None
    events: list[Event] = []
    m = _live(fakes, members, tmp_path / "ck", shm, events)
    assert _warnings(events) == [f"not live: staging needs about {(N * 400 * MiB * 11 // 10 + memstage.MARGIN) >> 20}"
                                 f" MiB in {shm}, 1024 MiB free; the workload stays stopped for the whole checkpoint"]
    assert [p.name for p in m.phases] == ["lock", "backup", "dump", "seal"] and "live" not in m.options
    for p in members:
        assert running(p.pid) and fakes.backends[p.pid].current == State.RUNNING
    assert list(shm.iterdir()) == []


def test_the_snapshots_share_the_room_beside_the_images(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Run:
        live_cap = -1

        def __init__(self, device: int) -> None:
            self.device = device

        def live_need(self) -> tuple[int, int]:
            return self.device, 10 * MiB

    monkeypatch.setattr(memstage, "free_bytes", lambda directory: 1024 * MiB)
    runs = [Run(100 * MiB), Run(300 * MiB)]
    assert pipeline.live_fits(runs, shm, lambda e: None)  # type: ignore[arg-type]
    room = memstage.room_beside(shm, 20 * MiB)
    assert [r.live_cap for r in runs] == [min(100 * MiB, room // 4), min(300 * MiB, room * 3 // 4)]
    assert sum(r.live_cap for r in runs) <= room


@pytest.mark.parametrize("point", ["after:lock@{pid}", "after:backup@{pid}", "after:dump@{pid}", "before:resume",
                                   "after:resume", "during:write-behind", "after:write-behind", "after:seal"])
def test_a_failure_at_each_step_leaves_every_member_running_and_nothing_behind(
        point: str, fakes: SetFakes, members: list[subprocess.Popen[bytes]], tmp_path: Path, shm: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUSNAP_TEST_FAIL", point.format(pid=members[1].pid))
    with pytest.raises(NpusnapError, match="test failure injected"):
        _live(fakes, members, tmp_path / "ck", shm, [])
    _assert_all_undone(fakes, members, tmp_path / "ck")
    assert list(shm.iterdir()) == []


@pytest.mark.parametrize("call", ["lock", "backup", "dump"])
def test_a_signal_in_a_members_step_leaves_every_member_running_and_nothing_behind(
        call: str, fakes: SetFakes, members: list[subprocess.Popen[bytes]], tmp_path: Path, shm: Path) -> None:
    script = fakes.criu_script if call == "dump" else fakes.scripts[members[1].pid]
    script.interrupt = {call}
    with pytest.raises(Interrupted):
        _live(fakes, members, tmp_path / "ck", shm, [])
    _assert_all_undone(fakes, members, tmp_path / "ck")
    assert list(shm.iterdir()) == []


@pytest.mark.parametrize("where", ["guardian", "go_live"])
def test_a_ctrl_c_before_the_pipelines_handlers_leaves_nothing_behind(
        where: str, fakes: SetFakes, members: list[subprocess.Popen[bytes]], tmp_path: Path, shm: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's own SIGINT handler (KeyboardInterrupt) between the staging directory's creation and
    the pipeline's handlers (the guardian starting, the set's memory staging made): the staging and
    the memory staging are removed."""
    import dataclasses

    from npusnap_cli.core import processset

    services = fakes.services()
    if where == "guardian":
        make = services.guardian

        def guardian(staging: Path, pid: int) -> object:
            make(staging, pid)
            raise KeyboardInterrupt

        services = dataclasses.replace(services, guardian=guardian)
    else:
        def go_live(self: CheckpointRun, stage: object = None) -> None:
            raise KeyboardInterrupt
        monkeypatch.setattr(CheckpointRun, "go_live", go_live)
    with pytest.raises(KeyboardInterrupt):
        processset.checkpoint_set([p.pid for p in members],
                                  pipeline.CheckpointOptions(directory=tmp_path / "ck", leave_running=True, live=True,
                                                             live_staging=shm), progress=lambda e: None,
                                  services=services)
    assert [p.name for p in tmp_path.iterdir()] == [] and list(shm.iterdir()) == []
    for p in members:
        assert running(p.pid) and fakes.backends[p.pid].current == State.RUNNING


def test_every_members_criu_starts_before_the_set_locks(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                                        tmp_path: Path, shm: Path) -> None:
    """Each member's CRIU is at its pre-dump notification (its start-up done) before any member is
    locked: the set's downtime holds no CRIU start-up."""
    order: list[tuple[str, int]] = []
    dump = fakes.criu.dump

    def starting(o: DumpOptions) -> None:
        order.append(("criu", o.pid))
        dump(o)

    fakes.criu.dump = starting  # type: ignore[method-assign]
    for p in members:
        backend = fakes.backends[p.pid]
        lock = backend.lock
        backend.lock = lambda timeout, lease=None, pid=p.pid, lock=lock: (order.append(("lock", pid)),  # type: ignore[method-assign]
                                                                          lock(timeout, lease))[1]
    m = _live(fakes, members, tmp_path / "ck", shm, [])
    first_lock = next(i for i, (what, _) in enumerate(order) if what == "lock")
    assert sorted(pid for what, pid in order[:first_lock]) == sorted(p.pid for p in members), order
    assert m.options["live"]["downtime_s"] > 0 and verify(tmp_path / "ck")


@pytest.mark.parametrize("k", range(N))
def test_a_criu_failing_before_its_notification_locks_no_member(k: int, fakes: SetFakes,
                                                                members: list[subprocess.Popen[bytes]],
                                                                tmp_path: Path, shm: Path) -> None:
    dump = fakes.criu.dump

    def failing(o: DumpOptions) -> None:  # member k's CRIU fails in its start-up; the others wait, then give up
        if o.pid == members[k].pid:
            raise CriuFailed("fake CRIU could not start")
        dump(o)

    fakes.criu.dump = failing  # type: ignore[method-assign]
    with pytest.raises(CriuFailed, match=rf"^process {members[k].pid} \(set member {k + 1} of {N}\): fake CRIU"):
        _live(fakes, members, tmp_path / "ck", shm, [])
    assert all("lock" not in fakes.scripts[p.pid].log for p in members)
    _assert_all_undone(fakes, members, tmp_path / "ck")
    assert list(shm.iterdir()) == []
