"""The checkpoint pipeline, as a library (the CLI and, later, a multi-node coordinator call it
per node), written as explicit steps over an undo stack:

    checkpoint:  lock -> backup -> dump (tree left stopped) -> seal -> commit
                 -> kill (default) | resume + device restore + unlock (--leave-running)
    dump:        (the runbook's DUMP: the device is already backed up) dump -> seal -> commit
                 -> kill | resume, still backed up

Every step pushes its undo before it starts; any failure, timeout or Ctrl-C runs the undos in
reverse, so the workload ends running and unlocked. The process is killed only after the
checkpoint is committed: a checkpoint that failed never costs the job.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from .. import __version__, netlock, testhooks
from ..backends import Backend, BackendName, DataPath, DataPathChoice, State
from ..criuopts import CriuOptions
from ..errors import WrongState
from ..image.format import CRIU_DIR, DEVICE_DIR, DeviceState, FileEntry, Manifest, PhaseTiming, ProcessEntry
from ..image.staging import Staging
from ..platform.criu import DumpOptions
from . import communicators, processes
from .progress import BytesExpected, Phases, Progress, quiet, warn
from .services import REAL, Services
from .signals import Signals
from .undo import UndoStack


@dataclass
class CheckpointOptions:
    directory: Path
    leave_running: bool = False
    shell_job: bool = False
    tcp_established: bool = False
    device: BackendName = BackendName.AUTO
    lock_timeout: float = 60.0
    criu_timeout: Optional[float] = None
    replace: bool = False
    criu_path: Optional[str] = None
    lease: float = 10.0  # the agent unlocks by itself after this much run time without us
    data_path: DataPathChoice = DataPathChoice.AUTO  # direct: the daemon streams device memory to DIR/device
    criu: CriuOptions = field(default_factory=CriuOptions)  # link-remap, ghost-limit, network lock, ...
    force: bool = False  # checkpoint HCCL ranks whose peers are not in the set (they will hang or fail)


def checkpoint(pid: int, opts: CheckpointOptions, progress: Progress = quiet,
               services: Services = REAL) -> Manifest:
    """Checkpoint pid into opts.directory. Raises NpusnapError after rolling back."""
    run = CheckpointRun(pid, opts, progress, services, opts.data_path)
    run.expect(State.RUNNING)
    communicators.admit({pid: run.backend}, opts.force, progress)  # a rank alone: its peers are outside
    return run.execute([run.lock, run.backup, run.dump, run.seal], run.finish_checkpoint)


def dump(pid: int, opts: CheckpointOptions, progress: Progress = quiet, services: Services = REAL) -> Manifest:
    """The runbook's DUMP phase alone: the device must already be backed up (`npusnap lock` +
    `npusnap backup`, which stage device memory in the process), and with leave_running the
    process resumes still backed up, for the runbook to restore."""
    run = CheckpointRun(pid, opts, progress, services, DataPathChoice.IN_PROCESS)
    run.expect(State.RUNNING if run.backend.name == BackendName.NONE else State.BACKED_UP)
    return run.execute([run.describe_device, run.dump, run.seal], run.finish_dump)


class CheckpointRun:
    """One checkpoint: what its steps share. Each step is a method; execute() runs them."""

    def __init__(self, pid: int, opts: CheckpointOptions, progress: Progress, services: Services,
                 data_path: DataPathChoice) -> None:
        self.pid, self.opts, self.progress = pid, opts, progress
        self.target = services.open_target(pid)
        self.criu = services.criu(opts.criu_path)
        self.extra = opts.criu
        if opts.tcp_established or self.extra.network_lock:  # the lock matters only to dumped connections
            lock = netlock.choose(self.extra.network_lock, self.criu.binary.path)
            self.extra = replace(self.extra, network_lock=lock)
        self.backend: Backend = services.select_backend(pid, opts.device, self.target.maps(), data_path)
        self.services = services
        self.direct = self.backend.method == DataPath.DIRECT
        self.undos = UndoStack(lambda m: warn(progress, m))
        self.phase = Phases(progress)
        self.signals = Signals()
        self.device = DeviceState()
        self.device_files: list[FileEntry] = []
        self.tree: list[ProcessEntry] = []
        self.frozen: list[int] = []  # the tree CRIU froze, from its pstree.img once the dump returned
        self.files: list[FileEntry] = []
        self.dump_timing = PhaseTiming("dump", 0.0)
        self.device_back = not self.direct  # the direct path's staged device data is the only copy until this

    def expect(self, expected: State) -> None:
        """Refuse a process whose device is not where this pipeline starts; checked before anything is locked."""
        state = self.backend.state()
        if state != expected:
            if expected == State.BACKED_UP:
                raise WrongState(f"process {self.pid} is {state}: its device state is not backed up yet",
                                 f"run `npusnap lock {self.pid}` and `npusnap backup {self.pid}` first")
            raise WrongState(f"process {self.pid} is {state}, not RUNNING",
                             f"finish or undo the manual phases first (`npusnap recover {self.pid}`)")
        processes.refuse_device_children(self.target)

    def execute(self, steps: list[Callable[[], None]], finish: Callable[[Manifest], None]) -> Manifest:
        self.staging = Staging(self.opts.directory, self.opts.replace)
        # From now on, our death is cleaned up after.
        self.guardian = self.services.guardian(self.staging.path, self.pid)
        try:
            with self.signals:
                self.undos.push("cleanup", self._discard)
                try:
                    for step in steps:
                        step()
                    manifest = self._commit()
                except BaseException:
                    self.signals.rolling_back = True
                    self.undos.rollback()
                    raise
                self.undos.forget()
                # Committed: signals no longer interrupt, and a failure from here on costs
                # nothing but this process's own state.
                if self.signals.pending:
                    warn(self.progress, "interrupt received after the checkpoint was committed: finishing it")
                finish(manifest)
                return manifest
        finally:
            self.backend.release()
            self.guardian.release()

    # -- the steps, in order
    def lock(self) -> None:
        # Pushed before the lock: a signal may land the instant a phase returns. The undo
        # undoes whatever part of lock and backup really happened.
        self.undos.push("device rollback", self._device_rollback)
        with self.phase("lock"):
            self.backend.lock(self.opts.lock_timeout, lease=self.opts.lease)
        if self.direct:
            self.guardian.recover_from(self.staging.device_dir)  # if we die, it brings the device data back

    def backup(self) -> None:
        self.backend.fence()  # a CLI stopped past its lease stops here, before each step
        with self.phase("backup") as t:
            if self.direct:
                self.progress(BytesExpected("backup", self.staging.device_dir, self.backend.describe().bytes))
            self.device_files = self.backend.backup(self.staging.device_dir)
            self.device = self.backend.describe()
            t.bytes = self.device.bytes

    def describe_device(self) -> None:
        """The runbook's dump: the device was backed up by earlier commands; it is only described."""
        self.device = self.backend.describe()

    def dump(self) -> None:
        self.backend.fence()
        before = self.target.tree()
        self.guardian.watch([p.pid for p in before])  # CRIU leaves them stopped: resumed if we die
        criu_dir = self.staging.criu_dir
        with self.phase("dump") as self.dump_timing, self.signals.critical(), self.staging.follow(criu_dir):
            self.progress(BytesExpected("dump", criu_dir, processes.resident_bytes([p.pid for p in before])))
            self.undos.push("resume", lambda: self._run_on(criu_dir))
            self.criu.dump(DumpOptions(
                pid=self.pid, images_dir=criu_dir, log_dir=self.staging.log_dir,
                leave_stopped=True, shell_job=self.opts.shell_job,
                tcp_established=self.opts.tcp_established, timeout=self.opts.criu_timeout, extra=self.extra,
            ))
            self.tree = processes.dumped_entries(self.criu.dumped_tree(criu_dir), before)
            self.frozen = [p.pid for p in self.tree]
            self.guardian.watch(self.frozen)

    def seal(self) -> None:
        with self.phase("seal") as t:
            self.files = self.staging.seal(known=self.device_files)
            t.bytes = self.dump_timing.bytes = sum(f.size for f in self.files if f.path.startswith(CRIU_DIR))

    def _commit(self) -> Manifest:
        manifest = self._manifest()
        with self.signals.commit_point():
            self.staging.commit(manifest)
            testhooks.pause("commit", until=lambda: self.signals.pending)
        return manifest

    # -- after the commit
    def finish_checkpoint(self, manifest: Manifest) -> None:
        if not self.opts.leave_running:
            processes.kill(self.frozen)
            return
        self._run_on(self.staging.final / CRIU_DIR)
        # From the committed directory: the staging path has moved.
        self.backend.finish_after_commit(self.staging.final / DEVICE_DIR, self.device_files)

    def finish_dump(self, manifest: Manifest) -> None:
        if not self.opts.leave_running:
            processes.kill(self.frozen)
            return
        self._run_on(self.staging.final / CRIU_DIR)

    # -- helpers and undos
    def _manifest(self) -> Manifest:
        opts = self.opts
        return Manifest(
            pid=self.pid,
            created=datetime.now(timezone.utc).isoformat(timespec="microseconds"),  # prune orders by it
            host=socket.gethostname(),
            kernel=os.uname().release,
            npusnap_version=__version__,
            criu_version=self.criu.binary.version_str,
            command=self.target.command,
            options={"shell_job": opts.shell_job, "tcp_established": opts.tcp_established,
                     "leave_running": opts.leave_running, **self.extra.recorded()},
            processes=self.tree,
            device=self.device,
            phases=self.phase.timings,
            files=self.files,
        )

    def _run_on(self, images_dir: Path) -> None:
        """Resume a dumped tree that runs on: first undo CRIU's network lock, which it keeps
        for a tree it leaves stopped, or the tree's TCP connections are dead."""
        try:
            self.criu.release_network_lock(images_dir, self.extra.network_lock, self.frozen,
                                           lambda m: warn(self.progress, m))
        except Exception as e:  # never keep the tree stopped over this
            warn(self.progress, f"could not undo CRIU's network lock: {e}")
        processes.resume(self.pid, self.frozen)

    def _device_rollback(self) -> None:
        self.backend.back_to_running()
        self.device_back = True

    def _discard(self) -> None:
        staging = self.staging
        try:
            staged = not staging.committed and any(staging.device_dir.iterdir())
        except OSError:
            staged = False
        if self.device_back or not staged:
            staging.discard()
            return
        # The workload still needs this data: never delete it (no manifest: it does not look valid).
        warn(self.progress, f"the device data of process {self.pid} stays in {staging.device_dir}: "
                            f"`npusnap recover {self.pid} --device-images {staging.device_dir}` puts it back")
