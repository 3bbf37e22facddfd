"""Fakes for the pipelines' services (npusnap_cli.core.services): a device backend with CANN's
state machine, a CRIU that writes a small image and leaves the tree stopped as the real one does,
a guardian that only records. Each can be told to fail, or to send us SIGINT, at a named call."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Optional, Sequence

from npusnap_cli.backends import BackendName, DataPath, State
from npusnap_cli.core.services import Services
from npusnap_cli.errors import CriuFailed, DeviceFailed, LeaseLost, WrongState
from npusnap_cli.image.format import DEVICE_DIR, DeviceState, FileEntry, checksum_file
from npusnap_cli.platform.criuimages import CORE_MAGIC
from tests.helpers import proc_state


@dataclass
class Script:
    """Where a fake misbehaves: fail[call] raises that error; interrupt holds the calls that
    send SIGINT to this process once their work is done (the signal lands as they return)."""

    fail: dict[str, Exception] = field(default_factory=dict)
    interrupt: set[str] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def at(self, call: str) -> None:
        self.log.append(call)
        if call in self.fail:
            raise self.fail[call]

    def after(self, call: str) -> None:
        if call in self.interrupt:
            os.kill(os.getpid(), signal.SIGINT)


class FakeBackend:
    """CANN's snapshot state machine for one process, without a device."""

    def __init__(self, script: Script, state: State = State.RUNNING, method: DataPath = DataPath.IN_PROCESS,
                 nbytes: int = 4096) -> None:
        self.script = script
        self.current = state
        self.name = BackendName.ASCEND  # a backend whose restore needs no device daemon check
        self.method = method
        self.nbytes = nbytes
        self.released = 0

    def _step(self, call: str, allowed: Sequence[State], to: State) -> None:
        self.script.at(call)
        if self.current not in allowed:
            raise WrongState(f"{call} while {self.current}")
        self.current = to
        self.script.after(call)

    def state(self) -> State:
        return self.current

    def describe(self) -> DeviceState:
        return DeviceState(backend=self.name.value, devices=[0], allocations=1, bytes=self.nbytes,
                           method=self.method.value)

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        self._step("lock", (State.RUNNING,), State.LOCKED)

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        files: list[FileEntry] = []
        if self.method == DataPath.DIRECT:
            assert device_dir is not None
            image = device_dir / "dev0.img"
            image.write_bytes(b"\x5a" * self.nbytes)
            size, digest = checksum_file(image)
            files.append(FileEntry(f"{DEVICE_DIR}/dev0.img", size, digest))
        self._step("backup", (State.LOCKED,), State.BACKED_UP)
        return files

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        self._step("restore", (State.BACKED_UP,), State.LOCKED)

    def unlock(self) -> None:
        self._step("unlock", (State.LOCKED, State.BACKED_UP), State.RUNNING)

    def back_to_running(self) -> None:
        self.script.at("back_to_running")
        if self.current == State.BACKED_UP:
            self.restore()
        if self.current == State.LOCKED:
            self.unlock()

    def fence(self) -> None:
        self.script.at("fence")

    def frozen_by_criu(self) -> ContextManager[None]:
        self.fence()
        return contextlib.nullcontext()

    def adopt_lease(self, lease: float) -> None:
        self.script.at("adopt_lease")

    def release(self) -> None:
        self.released += 1

    def finish_after_commit(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        self.restore(device_dir, files)
        self.unlock()


@dataclass
class FakeBinary:
    path: str = "/nonexistent/criu"
    version_str: str = "4.2 (fake)"


class FakeCriu:
    """Dump: an image file and a log, and the tree left stopped (SIGSTOP), as CRIU's
    leave_stopped does. Restore: a fresh process started in place of the checkpointed tree."""

    def __init__(self, script: Script, on_dump: Callable[[], None] = lambda: None) -> None:
        self.script = script
        self.binary = FakeBinary()
        self.on_dump = on_dump
        self.dumped: list[int] = []
        self.trees: dict[Path, list[int]] = {}  # images directory -> the tree dumped there (a set has several)
        self.restored: list[subprocess.Popen[bytes]] = []
        self.network_lock_released: list[Path] = []

    def dump(self, o: object) -> None:
        images_dir: Path = o.images_dir
        (Path(o.log_dir) / "dump.log").write_text("fake dump\n")
        if o.pre_dump is not None:  # CRIU's pre-dump notification: before it freezes the tree
            o.pre_dump()
        self.script.at("dump")
        pid: int = o.pid
        (images_dir / "pages-1.img").write_bytes(os.urandom(8192))
        (images_dir / "pstree.img").write_bytes(b"fake")
        # core-PID.img as CRIU writes it, saying the process was running (core_entry.tc.task_state = 1)
        (images_dir / f"core-{o.pid}.img").write_bytes(CORE_MAGIC.to_bytes(4, "little") + (4).to_bytes(4, "little")
                                                       + b"\x1a\x02\x08\x01")
        os.kill(pid, signal.SIGSTOP)
        self.dumped = self.trees[Path(images_dir)] = [pid]
        self.on_dump()
        self.script.after("dump")

    def dumped_tree(self, images_dir: Path) -> list[tuple[int, int, int]]:
        return [(pid, os.getpid(), 1) for pid in self.trees.get(Path(images_dir), self.dumped)]

    def restore(self, images_dir: Path, log_dir: Path, shell_job: bool = False, tcp_established: bool = False,
                log_level: int = 4, extra: object = None, started: Optional[Callable[[int], None]] = None,
                leave_stopped: bool = False, lazy_pages: bool = False) -> int:
        """The restored process stops itself first when leave_stopped (as CRIU leaves it), and
        once running it writes `ran` beside the checkpoint: a test can tell whether it ever ran."""
        self.script.at("criu-restore")
        criu_dir = Path(images_dir)
        while criu_dir.name != "criu" and criu_dir != criu_dir.parent:  # a set member's: criu/PID
            criu_dir = criu_dir.parent
        code = (("import os, signal; os.kill(os.getpid(), signal.SIGSTOP)\n" if leave_stopped else "")
                + f"open({str(criu_dir.parent.parent / 'ran')!r}, 'w').close()\nimport time; time.sleep(120)")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.restored.append(proc)
        deadline = time.monotonic() + 30
        while leave_stopped and proc_state(proc.pid) not in ("T", "t", "Z", "gone") and time.monotonic() < deadline:
            time.sleep(0.005)
        self.script.after("criu-restore")
        return proc.pid

    def release_network_lock(self, images_dir: Path, method: Optional[str], pids: list[int],
                             warn: Callable[[str], None]) -> None:
        self.network_lock_released.append(images_dir)

    def reap(self) -> None:
        for proc in self.restored:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


class FakeGuardian:
    def __init__(self, staging: Optional[Path], pid: int) -> None:
        self.staging, self.pid = staging, pid
        self.said: list[str] = []
        self.released = False

    def watch(self, pids: list[int]) -> None:
        self.said.append(f"watch {pids}")

    def kill_if_dead(self, pids: list[int]) -> None:
        self.said.append(f"kill {pids}")

    def wait_for_criu(self, pid: int) -> None:
        self.said.append(f"criu {pid}")

    def recover_from(self, device_dir: Path, chain: Sequence[Path] = ()) -> None:
        self.said.append("recover")

    def recover_kept(self, daemon: str, member: Optional[int] = None) -> None:
        self.said.append("recover kept" if member is None else f"recover kept {member}")

    def meet(self, directory: Path, pids: list[int], owned: bool = True) -> None:
        self.said.append(f"meet {pids}")

    def committing(self, staging: Path, final: Path, kills: bool) -> None:
        self.said.append(f"commit {'kill' if kills else 'run'}")

    def restoring(self) -> None:
        self.said.append("restoring")

    def remove_after(self, directory: Path) -> None:
        self.said.append(f"remove {directory}")

    def resumed(self) -> None:
        self.said.append("resumed")

    def release(self) -> None:
        self.released = True


class _View:
    def enter(self, images_dir: Path, warn: Callable[[str], None]) -> Path:
        return images_dir


@contextlib.contextmanager
def _no_view() -> Iterator[_View]:
    yield _View()


@dataclass
class Fakes:
    """One test's fakes, and the Services that hand them to the pipelines."""

    script: Script
    backend: FakeBackend
    criu: FakeCriu
    guardians: list[FakeGuardian] = field(default_factory=list)
    restore_backend: Optional[FakeBackend] = None

    def services(self) -> Services:
        def guardian(staging: Optional[Path], pid: int) -> FakeGuardian:
            g = FakeGuardian(staging, pid)
            self.guardians.append(g)
            return g

        def for_restore(pid: int, device: DeviceState, device_map: Optional[dict[str, str]]) -> FakeBackend:
            assert self.restore_backend is not None, "this test restores no device"
            return self.restore_backend

        return Services(
            criu=lambda path: self.criu,
            select_backend=lambda pid, requested, maps, data_path: self.backend,
            restore_backend=for_restore,
            guardian=guardian,
            images_view=_no_view,
            device_fits=lambda device: None,
            become_subreaper=lambda: None,  # never make the test runner a subreaper
        )


def fail(call: str, kind: type[Exception] = DeviceFailed) -> dict[str, Exception]:
    if kind is LeaseLost:
        return {call: LeaseLost("the lease ran out (fake)")}
    if kind is CriuFailed:
        return {call: CriuFailed(f"fake CRIU {call} failed")}
    return {call: kind(f"fake {call} failed")}
