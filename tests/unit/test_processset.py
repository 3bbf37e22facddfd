"""A process set (core/processset.py) with fake backends, one per member, and a fake CRIU around
real processes: all or nothing at every step of the checkpoint and of the restore, the members'
locks at once, overlapping members refused, errors that name the member."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from npusnap_cli.backends import DataPath, State
from npusnap_cli.core import processset
from npusnap_cli.core.checkpoint import CheckpointOptions
from npusnap_cli.core.progress import Event, PhaseStarted
from npusnap_cli.core.restore import RestoreOptions
from npusnap_cli.core.services import Services
from npusnap_cli.errors import CriuFailed, DeviceFailed, ImageInvalid, Interrupted, NpusnapError, UnsupportedTarget
from npusnap_cli.image.format import (
    SET_FORMAT_VERSION,
    Manifest,
    load_manifest,
    manifest_text,
    member_summary,
    verify,
)
from npusnap_cli.platform.criu import DumpOptions
from tests.helpers import proc_state, running

from .fakes import FakeBackend, FakeCriu, FakeGuardian, Script, _no_view, fail

N = 3


@dataclass
class SetFakes:
    """A backend and a script per member (failures aimed at one member), one CRIU, and the
    backends a restore gets, in order."""

    criu_script: Script = field(default_factory=Script)
    scripts: dict[int, Script] = field(default_factory=dict)
    backends: dict[int, FakeBackend] = field(default_factory=dict)
    restored_backends: list[FakeBackend] = field(default_factory=list)
    guardians: list[FakeGuardian] = field(default_factory=list)
    method: DataPath = DataPath.IN_PROCESS
    restore_fails: dict[int, Exception] = field(default_factory=dict)  # the k-th restore backend's call fails

    def __post_init__(self) -> None:
        self.criu = FakeCriu(self.criu_script)

    def add(self, pid: int) -> None:
        self.scripts[pid] = Script()
        self.backends[pid] = FakeBackend(self.scripts[pid], method=self.method)

    def services(self) -> Services:
        def guardian(staging: Optional[Path], pid: int) -> FakeGuardian:
            g = FakeGuardian(staging, pid)
            self.guardians.append(g)
            return g

        def for_restore(pid: int, device: object, device_map: object) -> FakeBackend:
            script = Script()
            k = len(self.restored_backends)
            if k in self.restore_fails:
                script.fail = {"restore": self.restore_fails[k]}
            b = FakeBackend(script, State.BACKED_UP)
            self.restored_backends.append(b)
            return b

        return Services(criu=lambda path: self.criu,
                        select_backend=lambda pid, requested, maps, data_path: self.backends[pid],
                        restore_backend=for_restore, guardian=guardian, images_view=_no_view,
                        device_fits=lambda device: None, become_subreaper=lambda: None)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


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


def _checkpoint(fakes: SetFakes, members: list[subprocess.Popen[bytes]], directory: Path,
                events: Optional[list[Event]] = None, **opts: object) -> Manifest:
    return processset.checkpoint_set([p.pid for p in members], CheckpointOptions(directory=directory, **opts),  # type: ignore[arg-type]
                                     progress=(events if events is not None else []).append,
                                     services=fakes.services())


def _nothing_left(directory: Path) -> bool:
    return not directory.exists() and not any(directory.parent.glob(f".{directory.name}.*"))


def _assert_all_undone(fakes: SetFakes, members: list[subprocess.Popen[bytes]], directory: Path) -> None:
    for p in members:
        assert running(p.pid), proc_state(p.pid)
        assert fakes.backends[p.pid].current == State.RUNNING
        assert fakes.backends[p.pid].released
    assert _nothing_left(directory)
    assert all(g.released for g in fakes.guardians)


def test_a_set_commits_one_manifest_then_kills_every_member(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                                           tmp_path: Path) -> None:
    events: list[Event] = []
    m = _checkpoint(fakes, members, tmp_path / "ck", events)
    pids = [p.pid for p in members]
    for p in members:
        assert proc_state(p.pid) in ("Z", "gone")
        assert fakes.backends[p.pid].current == State.BACKED_UP
        assert fakes.scripts[p.pid].log == ["lock", "fence", "backup", "fence"]  # the dump is CRIU's
    on_disk = verify(tmp_path / "ck")
    assert on_disk == m == load_manifest(tmp_path / "ck")
    assert m.is_set and m.format_version == SET_FORMAT_VERSION and [e.pid for e in m.members] == pids
    assert [p.pid for p in m.processes] == pids
    assert m.device.bytes == N * 4096 and m.device.backend == "ascend"
    assert [p.name for p in m.phases] == ["lock", "backup", "dump", "seal"]
    for e in m.members:
        assert [p.name for p in e.phases] == ["lock", "backup", "dump"]
        assert {f.path.split("/")[1] for f in m.files if f.path.startswith("criu/")} == {str(p) for p in pids}
        s = member_summary(m, e)
        own = [f for f in m.files if f.path.startswith(f"criu/{e.pid}/")]
        assert s["files"] == len(own) >= 2 and s["bytes"] == sum(f.size for f in own)
    assert len({member_summary(m, e)["checksum"] for e in m.members}) == N  # each member's own images
    logs = sorted(os.listdir(tmp_path / "ck" / "logs"))
    assert logs == sorted(f"dump-{p}.log" for p in pids)
    started = [(e.name, e.member) for e in events if isinstance(e, PhaseStarted)]
    assert ("lock", None) in started and all(("dump", p) in started for p in pids)
    assert len(fakes.guardians) == 1 and fakes.guardians[0].released


def test_the_members_lock_at_once(fakes: SetFakes, members: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    # Each lock waits until every member is inside its lock: only locks run side by side get through.
    barrier = threading.Barrier(N, timeout=30)
    for script in fakes.scripts.values():
        original = script.at

        def at(call: str, original=original) -> None:  # type: ignore[no-untyped-def]
            original(call)
            if call == "lock":
                barrier.wait()

        script.at = at  # type: ignore[method-assign]
    _checkpoint(fakes, members, tmp_path / "ck")
    verify(tmp_path / "ck")


def test_leave_running_runs_every_member_on(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                            tmp_path: Path) -> None:
    _checkpoint(fakes, members, tmp_path / "ck", leave_running=True)
    for p in members:
        assert running(p.pid)
        assert fakes.backends[p.pid].current == State.RUNNING
        assert fakes.scripts[p.pid].log[-2:] == ["restore", "unlock"]
    assert sorted(fakes.criu.network_lock_released) == sorted(tmp_path / "ck" / "criu" / str(p.pid) for p in members)
    verify(tmp_path / "ck")


@pytest.mark.parametrize("k", range(N))
@pytest.mark.parametrize("call, error", [("lock", DeviceFailed), ("backup", DeviceFailed), ("fence", DeviceFailed)])
def test_a_device_failure_in_member_k_undoes_every_member(k: int, call: str, error: type[Exception], fakes: SetFakes,
                                                          members: list[subprocess.Popen[bytes]],
                                                          tmp_path: Path) -> None:
    pid = members[k].pid
    fakes.scripts[pid].fail = fail(call, error)
    with pytest.raises(error) as caught:
        _checkpoint(fakes, members, tmp_path / "ck")
    assert str(caught.value).startswith(f"process {pid} (set member {k + 1} of {N}): fake {call} failed")
    _assert_all_undone(fakes, members, tmp_path / "ck")


@pytest.mark.parametrize("k", range(N))
def test_a_criu_failure_in_member_k_undoes_every_member(k: int, fakes: SetFakes,
                                                        members: list[subprocess.Popen[bytes]],
                                                        tmp_path: Path) -> None:
    dump = fakes.criu.dump

    def failing_dump(o: DumpOptions) -> None:  # the members dump at once: member k's, whenever it comes
        if o.pid == members[k].pid:
            raise CriuFailed("fake CRIU dump failed")
        dump(o)

    fakes.criu.dump = failing_dump  # type: ignore[method-assign]
    with pytest.raises(CriuFailed, match=rf"^process {members[k].pid} \(set member {k + 1} of {N}\)"):
        _checkpoint(fakes, members, tmp_path / "ck")
    _assert_all_undone(fakes, members, tmp_path / "ck")


@pytest.mark.parametrize("point", ["after:lock@{pid}", "after:backup@{pid}", "after:dump@{pid}",
                                   "before:dump@{pid}", "after:seal"])
def test_an_injected_failure_at_each_phase_undoes_every_member(point: str, fakes: SetFakes,
                                                               members: list[subprocess.Popen[bytes]],
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUSNAP_TEST_FAIL", point.format(pid=members[1].pid))
    with pytest.raises(NpusnapError, match="test failure injected"):
        _checkpoint(fakes, members, tmp_path / "ck")
    _assert_all_undone(fakes, members, tmp_path / "ck")


@pytest.mark.parametrize("call", ["lock", "backup", "dump"])
def test_a_signal_in_a_members_step_undoes_every_member(call: str, fakes: SetFakes,
                                                        members: list[subprocess.Popen[bytes]],
                                                        tmp_path: Path) -> None:
    script = fakes.criu_script if call == "dump" else fakes.scripts[members[1].pid]
    script.interrupt = {call}
    with pytest.raises(Interrupted):
        _checkpoint(fakes, members, tmp_path / "ck")
    _assert_all_undone(fakes, members, tmp_path / "ck")


def test_a_member_that_exits_mid_checkpoint_fails_the_set(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                                          tmp_path: Path) -> None:
    gone = members[2]
    original = fakes.scripts[gone.pid].at

    def at(call: str) -> None:
        original(call)
        if call == "backup":
            gone.kill()
            gone.wait()
            raise DeviceFailed("the agent closed the connection (fake: the process exited)")

    fakes.scripts[gone.pid].at = at  # type: ignore[method-assign]
    with pytest.raises(DeviceFailed, match=rf"^process {gone.pid} \(set member 3 of 3\)"):
        _checkpoint(fakes, members, tmp_path / "ck")
    for p in members[:2]:
        assert running(p.pid) and fakes.backends[p.pid].current == State.RUNNING
    assert _nothing_left(tmp_path / "ck")


def test_the_same_pid_twice_is_refused(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                       tmp_path: Path) -> None:
    with pytest.raises(UnsupportedTarget, match=f"process {members[0].pid} is named twice"):
        processset.checkpoint_set([members[0].pid, members[1].pid, members[0].pid],
                                  CheckpointOptions(directory=tmp_path / "ck"), services=fakes.services())
    assert all(s.log == [] for s in fakes.scripts.values()) and _nothing_left(tmp_path / "ck")


def test_a_member_inside_another_members_tree_is_refused(fakes: SetFakes, tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                               "print(c.pid, flush=True); time.sleep(120)"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        fakes.add(parent.pid)
        fakes.add(child)
        with pytest.raises(UnsupportedTarget, match=f"process {child} is a descendant of process {parent.pid}"):
            processset.checkpoint_set([child, parent.pid], CheckpointOptions(directory=tmp_path / "ck"),
                                      services=fakes.services())
        assert fakes.scripts[parent.pid].log == [] and fakes.scripts[child].log == []
        assert running(parent.pid) and running(child) and _nothing_left(tmp_path / "ck")
    finally:
        if child:
            os.kill(child, signal.SIGKILL)  # reaped by its parent, or by init once the parent is gone
        parent.kill()
        parent.wait()


# ---------------------------------------------------------------- restore


@pytest.fixture
def checkpointed(fakes: SetFakes, members: list[subprocess.Popen[bytes]], tmp_path: Path) -> Path:
    _checkpoint(fakes, members, tmp_path / "ck")
    for p in members:
        p.wait(timeout=10)
    return tmp_path / "ck"


def _restore(fakes: SetFakes, directory: Path, **opts: object) -> processset.SetRestoreResult:
    return processset.restore_set(RestoreOptions(directory, **opts), services=fakes.services())  # type: ignore[arg-type]


def test_a_set_restores_every_member_then_unlocks_them(fakes: SetFakes, checkpointed: Path,
                                                       members: list[subprocess.Popen[bytes]]) -> None:
    result = _restore(fakes, checkpointed)
    restored = [p.pid for p in fakes.criu.restored]
    assert sorted(m.pid for m in result.members) == sorted(restored) and len(restored) == N  # restored at once
    assert [m.checkpointed for m in result.members] == [p.pid for p in members]
    assert all(running(pid) for pid in restored)
    assert all(b.current == State.RUNNING and b.released for b in fakes.restored_backends)
    for b in fakes.restored_backends:
        assert b.script.log == ["adopt_lease", "restore", "unlock"]
    assert [p.name for p in result.phases] == ["verify", "unlock"]
    assert all([p.name for p in m.phases] == ["criu-restore", "device-restore"] for m in result.members)
    verify(checkpointed)


@pytest.mark.parametrize("k", range(N))
def test_a_criu_restore_failure_in_member_k_leaves_no_member_running(k: int, fakes: SetFakes,
                                                                     checkpointed: Path) -> None:
    restore = fakes.criu.restore
    subdir = load_manifest(checkpointed).members[k].subdir

    def failing(images_dir: Path, *args: object, **kw: object) -> int:
        if Path(images_dir).name == subdir:  # the members restore at once: member k's, whenever it comes
            raise CriuFailed("fake CRIU restore failed")
        return restore(images_dir, *args, **kw)  # type: ignore[arg-type]

    fakes.criu.restore = failing  # type: ignore[method-assign]
    with pytest.raises(CriuFailed, match=rf"\(set member {k + 1} of {N}\): fake CRIU restore failed"):
        _restore(fakes, checkpointed)
    assert len(fakes.criu.restored) == N - 1  # every other member was restored, and is killed
    assert all(proc_state(p.pid) in ("Z", "gone") for p in fakes.criu.restored)
    verify(checkpointed)
    fakes.criu.restore = restore  # type: ignore[method-assign]
    fakes.criu.reap()
    fakes.criu.restored.clear()
    fakes.restored_backends.clear()
    _restore(fakes, checkpointed)  # the checkpoint is intact: a retry restores the whole set
    assert all(running(p.pid) for p in fakes.criu.restored) and len(fakes.criu.restored) == N


@pytest.mark.parametrize("k", range(N))
def test_a_device_restore_failure_in_member_k_leaves_no_member_running(k: int, fakes: SetFakes,
                                                                       checkpointed: Path) -> None:
    fakes.restore_fails = {k: DeviceFailed("fake device restore failed")}
    with pytest.raises(DeviceFailed, match=rf"\(set member {k + 1} of {N}\)"):
        _restore(fakes, checkpointed)
    assert len(fakes.criu.restored) == N  # every member's process exists before any device restore
    assert all(proc_state(p.pid) in ("Z", "gone") for p in fakes.criu.restored)
    assert all(b.released for b in fakes.restored_backends)
    verify(checkpointed)


def test_a_signal_during_a_set_restore_leaves_no_member_running(fakes: SetFakes, checkpointed: Path) -> None:
    fakes.criu_script.interrupt = {"criu-restore"}  # lands as the first member's CRIU restore returns
    with pytest.raises(Interrupted):
        _restore(fakes, checkpointed)
    assert fakes.criu.restored and all(proc_state(p.pid) in ("Z", "gone") for p in fakes.criu.restored)
    verify(checkpointed)


# ---------------------------------------------------------------- the manifest


def _body(**over: object) -> dict[str, object]:
    d: dict[str, object] = {"format_version": 1, "pid": 5, "created": "x", "host": "h", "kernel": "k",
                            "npusnap_version": "v", "criu_version": "c"}
    d.update(over)
    return d


def _load(tmp_path: Path, d: dict[str, object]) -> Manifest:
    (tmp_path / "manifest.yaml").write_text(manifest_text(d))
    return load_manifest(tmp_path)


def test_a_single_process_manifest_has_no_members_and_version_1(tmp_path: Path) -> None:
    m = _load(tmp_path, _body())
    assert not m.is_set and "members" not in m.to_dict() and m.to_dict()["format_version"] == 1


@pytest.mark.parametrize("body, why", [
    (_body(members=[{"pid": 5}]), "format version 1 with 1 set members"),
    (_body(format_version=2), "format version 2 with 0 set members"),
    (_body(format_version=2, members=[{"pid": 5}, {"pid": 5}]), "are not distinct pids"),
    (_body(format_version=2, members=[{"pid": 5}],
           files=[{"path": "criu/6/x.img", "size": 1, "checksum": "0"}]), "belongs to no set member"),
    (_body(format_version=2, members="x"), "members is not a list"),
])
def test_a_malformed_set_manifest_is_refused(body: dict[str, object], why: str, tmp_path: Path) -> None:
    with pytest.raises(ImageInvalid, match=why):
        _load(tmp_path, body)


def test_a_restore_of_a_single_checkpoint_as_a_set_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "manifest.yaml").write_text(manifest_text(_body()))
    with pytest.raises(NpusnapError, match="one process's checkpoint, not a set"):
        processset.restore_set(RestoreOptions(tmp_path / "ck", verify=False))


class _RecordingGate:
    """A job's gate that records what it was told, and each member's device state at that moment."""

    def __init__(self, fakes: SetFakes) -> None:
        self.fakes = fakes
        self.told: list[tuple[str, list[State]]] = []

    def prepared(self, manifest: Manifest) -> None:
        pass

    def committed(self, manifest: Manifest) -> None:
        return None  # the set's directory stays where it committed it

    def failing(self, error: BaseException) -> None:
        self.told.append((str(error), [b.current for b in self.fakes.backends.values()]))


def test_a_job_hears_of_a_failure_before_the_rollback(fakes: SetFakes, members: list[subprocess.Popen[bytes]],
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its other nodes' HCCL ranks must roll back at the same time as ours: the gate is told while
    every member is still backed up, with the error that names the member."""
    monkeypatch.setenv("NPUSNAP_TEST_FAIL", f"before:dump@{members[1].pid}")
    gate = _RecordingGate(fakes)
    with pytest.raises(NpusnapError, match="test failure injected"):
        processset.checkpoint_set([p.pid for p in members], CheckpointOptions(directory=tmp_path / "ck"),
                                  services=fakes.services(), gate=gate)
    assert len(gate.told) == 1, gate.told
    error, states = gate.told[0]
    assert error.startswith(f"process {members[1].pid} (set member 2 of {N}): test failure injected"), error
    assert states == [State.BACKED_UP] * N, states
    _assert_all_undone(fakes, members, tmp_path / "ck")


class _StatesAtVote(_RecordingGate):
    """A staged job's gate: each member's device state and stop state at its vote, then an abort."""

    def prepared(self, manifest: Manifest) -> None:
        self.at_vote = [(b.current, running(pid)) for pid, b in self.fakes.backends.items()]
        raise NpusnapError("the coordinator aborted the job checkpoint: another node failed")


def test_run_on_at_seal_then_an_abort_leaves_every_member_running(
        fakes: SetFakes, members: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """--stage --leave-running: every member runs on, unlocked, before the vote; an abort after
    that undoes nothing on them (no second device restore or resume), only the checkpoint goes."""
    gate = _StatesAtVote(fakes)
    with pytest.raises(NpusnapError, match="another node failed"):
        processset.checkpoint_set([p.pid for p in members],
                                  CheckpointOptions(directory=tmp_path / "ck", leave_running=True, run_on_at_seal=True),
                                  services=fakes.services(), gate=gate)
    assert gate.at_vote == [(State.RUNNING, True)] * N, gate.at_vote
    for p in members:
        assert fakes.scripts[p.pid].log.count("restore") == 1, fakes.scripts[p.pid].log
        assert fakes.scripts[p.pid].log[-2:] == ["restore", "unlock"], fakes.scripts[p.pid].log
    _assert_all_undone(fakes, members, tmp_path / "ck")


@pytest.mark.parametrize("tcp", [False, True])
def test_the_members_dump_at_once_but_one_by_one_with_tcp(tcp: bool, fakes: SetFakes,
                                                         members: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """Their CRIUs' start-ups overlap; with --tcp-established each dump takes CRIU's network lock
    (iptables) of its own, so they come one after another."""
    dump = fakes.criu.dump
    running_now, most = [0], [0]
    lock = threading.Lock()

    def counted(o: DumpOptions) -> None:
        with lock:
            running_now[0] += 1
            most[0] = max(most[0], running_now[0])
        try:
            threading.Event().wait(0.2)  # long enough for every member's dump to start meanwhile
            dump(o)
        finally:
            with lock:
                running_now[0] -= 1

    fakes.criu.dump = counted  # type: ignore[method-assign]
    m = _checkpoint(fakes, members, tmp_path / "ck", tcp_established=tcp)
    assert most[0] == (1 if tcp else N)
    assert sorted(e.pid for e in m.members) == sorted(p.pid for p in members) and verify(tmp_path / "ck")


def test_the_members_restore_at_once(fakes: SetFakes, checkpointed: Path) -> None:
    """Their CRIUs' start-ups overlap; every member's process exists before any device restore."""
    restore = fakes.criu.restore
    running_now, most = [0], [0]
    lock = threading.Lock()

    def counted(*args: object, **kw: object) -> int:
        with lock:
            running_now[0] += 1
            most[0] = max(most[0], running_now[0])
        try:
            threading.Event().wait(0.2)  # long enough for every member's restore to start meanwhile
            return restore(*args, **kw)  # type: ignore[arg-type]
        finally:
            with lock:
                running_now[0] -= 1

    fakes.criu.restore = counted  # type: ignore[method-assign]
    result = _restore(fakes, checkpointed)
    assert most[0] == N and all(running(m.pid) for m in result.members)
