"""The checkpoint pipeline, as a library (the CLI and, later, a multi-node coordinator call it
per node), written as explicit steps over an undo stack:

    checkpoint:  lock -> backup -> dump (tree left stopped) -> seal -> commit
                 -> kill (default) | resume + device restore + unlock (--leave-running)
    live:        lock -> backup -> dump, both into memory (image/memstage.py) -> resume + device
                 restore + unlock -> write-behind to disk -> seal -> commit (--live)
    dump:        (the runbook's DUMP: the device is already backed up) dump -> seal -> commit
                 -> kill | resume, still backed up

Every step pushes its undo before it starts; any failure, timeout or Ctrl-C runs the undos in
reverse, so the workload ends running and unlocked. The process is killed only after the
checkpoint is committed: a checkpoint that failed never costs the job.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, cast

from .. import __version__, testhooks
from ..backends import Backend, BackendName, DataPath, DataPathChoice, State
from ..criuopts import CriuOptions
from ..errors import WrongState
from ..image import memstage
from ..image.format import (
    CRIU_DIR,
    DEVICE_DIR,
    DeviceState,
    FileEntry,
    Manifest,
    ParentRef,
    PhaseTiming,
    ProcessEntry,
    in_member,
)
from ..image.memstage import DEFAULT_DIR as LIVE_STAGING
from ..image.memstage import MemStage
from ..image.staging import Staging
from ..platform.criu import DumpOptions
from ..platform.criuimages import page_runs
from ..platform.procfs import process_exists
from . import communicators, processes
from .progress import BytesExpected, Phases, Progress, quiet, warn
from .services import REAL, GuardianLike, Services
from .signals import Signals
from .undo import UndoStack

if TYPE_CHECKING:
    from ..backends.direct import DirectBackend
    from ..image.store import Packer


@dataclass
class CheckpointOptions:
    """What `npusnap checkpoint` (and the runbook's DUMP) was asked to do."""

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
    parent: Optional[Path] = None  # incremental: write only the device chunks changed since this checkpoint
    dedup: bool = False  # host pages go to the chunk store beside DIR (image/store.py)
    compress: str = "none"  # auto | zstd | lz4 | none, for host pages and direct device images (implies the store)
    # a job's node: the set's HCCL peers on other nodes are checkpointed by their own nodes' workers at
    # the same time (their locks meet in the free pass; a peer that is not times the lock out)
    peers_elsewhere: bool = False
    # a job's node: the job checkpoint attempt's rendezvous directory (storage every node sees), where
    # the set's HCCL ranks meet their peers of every node in each in-place restore (rollback, running
    # on); None: a private one of the set's own
    rendezvous: Optional[Path] = None
    # --live (with leave_running): stopped only while the images are written to memory, then
    # copied to disk while the workload runs on (image/memstage.py), in a tmpfs directory here
    live: bool = False
    live_staging: Path = LIVE_STAGING
    # a job's node staged on local storage with --leave-running: the set runs on as soon as it is
    # sealed, before its write-behind to the shared storage and its vote (core/processset.py)
    run_on_at_seal: bool = False
    # a job's node staged on local storage: where its copy will live (the job's staging directory
    # on the shared storage), which its parent (--parent) is named relative to
    published: Optional[Path] = None

    def __post_init__(self) -> None:
        from ..image.codecs import effective

        self.compress = effective(self.compress, self.directory)  # auto into memory (a tmpfs): none


class Background:
    """A function run on a thread of its own; result() waits for it and raises what it raised."""

    def __init__(self, fn: Callable[[], list[FileEntry]], name: str) -> None:
        self.value: list[FileEntry] = []
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], list[FileEntry]]) -> None:
        try:
            self.value = fn()
        except BaseException as e:  # raised where result() is called
            self.error = e

    def wait(self) -> None:
        self.thread.join()

    def result(self) -> list[FileEntry]:
        self.wait()
        if self.error is not None:
            raise self.error
        return self.value


def checkpoint(pid: int, opts: CheckpointOptions, progress: Progress = quiet,
               services: Services = REAL) -> Manifest:
    """Checkpoint pid into opts.directory. Raises NpusnapError after rolling back."""
    run = CheckpointRun(pid, opts, progress, services, opts.data_path)
    run.expect(State.RUNNING)
    communicators.admit({pid: run.backend}, opts.force, progress)  # a rank alone: its peers are outside
    if opts.parent is not None:
        run.use_parent(opts.parent)
    if opts.live and opts.leave_running and run.live_fits():
        try:
            run.go_live()
            return run.execute([run.dump_locking_late, run.resume_now, run.write_behind, run.seal], lambda m: None)
        finally:
            run.drop_live()
    return run.execute([run.lock, run.backup, run.dump, run.seal], run.finish_checkpoint)


def dump(pid: int, opts: CheckpointOptions, progress: Progress = quiet, services: Services = REAL) -> Manifest:
    """The runbook's DUMP phase alone: the device must already be backed up (`npusnap lock` +
    `npusnap backup`, which stage device memory in the process), and with leave_running the
    process resumes still backed up, for the runbook to restore."""
    run = CheckpointRun(pid, opts, progress, services, DataPathChoice.IN_PROCESS)
    run.expect(State.RUNNING if run.backend.name == BackendName.NONE else State.BACKED_UP)
    return run.execute([run.describe_device, run.dump, run.seal], run.finish_dump)


def transaction(signals: Signals, undos: UndoStack, progress: Progress,
                work: Callable[[], Manifest], finish: Callable[[Manifest], None]) -> Manifest:
    """Run work (the steps, then the commit) under the signal handlers; on any failure or
    signal the undos run, newest first (the oldest, "cleanup", removes the staging directory:
    make_staging pushed it)."""
    try:
        with signals:
            try:
                manifest = work()
            except BaseException:
                signals.rolling_back = True
                undos.rollback()
                raise
            undos.forget()
            # Committed: signals no longer interrupt, and a failure from here on costs
            # nothing but this process's own state.
            if signals.pending:
                warn(progress, "interrupt received after the checkpoint was committed: finishing it")
            finish(manifest)
            return manifest
    except BaseException:
        staged_on(undos)  # a Ctrl-C as the handlers went in
        raise


def make_staging(staging: Staging, undos: UndoStack, discard: Callable[[], None],
                 start_guardian: Callable[[], GuardianLike]) -> GuardianLike:
    """The guardian started for staging (named, not made yet), then staging made; its cleanup
    (discard) is pushed first, so a Ctrl-C from here on, before the pipeline's handlers, leaves
    nothing. The guardian comes first: a SIGTERM before those handlers takes its default action,
    and had it come between the two it would have left the staging directory behind."""
    undos.push("cleanup", discard)
    guardian: Optional[GuardianLike] = None
    try:
        guardian = start_guardian()  # from now on, our death is cleaned up after (staging's creation too)
        staging.create()
        return guardian
    except BaseException:
        if guardian is not None:
            guardian.release()  # nothing for it to do: the cleanup below removes what was made
        staged_on(undos)
        raise


def staged_on(undos: UndoStack) -> None:
    """An interrupt (the CLI's own SIGINT handler: KeyboardInterrupt) between the staging
    directory's creation and the pipeline's handlers: the cleanup pushed with the staging runs,
    and whatever else was pushed by then (nothing, once rolled back or committed)."""
    if undos.names:
        undos.rollback()


def commit(staging: Staging, signals: Signals, manifest: Manifest, guardian: Optional[GuardianLike] = None,
           kills: bool = False) -> Manifest:
    """The commit point: the manifest written and the directory renamed into place. guardian: told
    first, so that our death after the rename ends in the checkpoint's outcome (the tree killed if
    kills, else running on), not in a rollback (a job's node: its job decides, not the rename)."""
    with signals.commit_point():
        if guardian is not None:
            guardian.committing(staging.path, staging.final, kills)
        staging.commit(manifest)
        testhooks.pause("commit", until=lambda: signals.pending)
    return manifest


def add_parts(t: PhaseTiming, parts: dict[str, tuple[float, int]]) -> None:
    """Steps added to a phase's, summed by name (a set's members' write-outs)."""
    for name, (seconds, nbytes) in parts.items():
        was = t.parts.get(name, {"seconds": 0.0, "bytes": 0})
        t.add_parts({name: (was["seconds"] + seconds, int(was["bytes"]) + nbytes)})


def live_fits(runs: list["CheckpointRun"], staging: Path, progress: Progress) -> bool:
    """--live: whether the images of every run (one process, or each member of a set) fit in memory
    together (the sum of their device and resident bytes); when not, say why: the checkpoint is
    then an ordinary --leave-running one. Each run's device snapshot may copy aside at most its
    share (by device bytes) of the room left beside the staged images."""
    needs = [r.live_need() for r in runs]
    device = sum(d for d, _ in needs)
    resident = sum(r for _, r in needs)
    problem = memstage.why_not(staging, device + resident)
    if problem is not None:
        warn(progress, f"not live: {problem}; the workload stays stopped for the whole checkpoint")
    room = memstage.room_beside(staging, resident)
    for run, (d, _) in zip(runs, needs):
        run.live_cap = min(d, room * d // device) if device else 0
    return problem is None


class CheckpointRun:
    """One checkpoint: what its steps share. Each step is a method; execute() runs them.

    A process set (core/processset.py) runs one of these per member (member=True): its images go
    to criu/PID/ and device/PID/, and the set hands every member the same staging directory,
    guardian, undo stack and signals (share()) and drives the steps itself."""

    def __init__(self, pid: int, opts: CheckpointOptions, progress: Progress, services: Services,
                 data_path: DataPathChoice, member: bool = False) -> None:
        self.pid, self.opts, self.progress = pid, opts, progress
        self.sub = str(pid) if member else None  # a set member's subdirectory of criu/ and device/
        self.target = services.open_target(pid)
        self.criu = services.criu(opts.criu_path)
        self.extra = opts.criu
        if opts.tcp_established or self.extra.network_lock:  # the lock matters only to dumped connections
            from .. import netlock

            lock = netlock.choose(self.extra.network_lock, self.criu.binary.path)
            self.extra = replace(self.extra, network_lock=lock)
        self.backend: Backend = services.select_backend(pid, opts.device, self.target.maps(), data_path)
        self.services = services
        self.direct = self.backend.method == DataPath.DIRECT
        self.undos = UndoStack(lambda m: warn(progress, m))
        self.phase = Phases(progress, member=pid if member else None)
        self.signals = Signals()
        self.device = DeviceState()
        self.device_files: list[FileEntry] = []
        self.tree: list[ProcessEntry] = []
        self.frozen: list[int] = []  # the tree CRIU froze, from its pstree.img once the dump returned
        self.files: list[FileEntry] = []
        self.dump_timing = PhaseTiming("dump", 0.0)
        self.device_back = not self.direct  # the direct path's staged device data is the only copy until this
        self.log_dir: Optional[Path] = None  # CRIU's logs: the staging's, or (a set member) a directory of its own
        self.parent: Optional[tuple[Path, Manifest]] = None  # incremental: the parent checkpoint
        self.packer: Optional[Packer] = None  # holds the chunk store's lock until the commit is done
        self.live: Optional[MemStage] = None  # --live: where the images are until the write-behind
        self.in_memory = False  # criu/ and device/ are being written in self.live, not the staging
        self.live_kept = False  # a failed put-back left the device data in self.live: it stays
        self.live_cap = 0  # --live: the most bytes the device snapshot may copy aside (live_fits)
        self.wrote_snapshot = False  # --live: the write-behind wrote the daemon's snapshot out
        self.stopped_at = 0.0
        self.downtime: Optional[float] = None  # --live: from the lock to the workload running on
        self.mem: Optional[Path] = None  # --compress: the device export staged in memory (image/memstage.py)
        # auto writes the device images plain, as none does (nothing staged): the store's verdict says
        # plain wins here, or there is none yet (probing: they are judged after the seal, for the next)
        self.device_plain = False
        self.probing = False
        self.packing: Optional[Background] = None  # --compress: its way to the store, while CRIU dumps
        self.writing: Optional[Background] = None  # the direct path's device images, written while CRIU dumps
        self.views = contextlib.ExitStack()  # a packed parent chain's device images, reassembled

    def share(self, staging: Staging, guardian: GuardianLike, undos: UndoStack, signals: Signals) -> None:
        """A set member: the set's staging directory, guardian, undo stack and signals."""
        self.staging, self.guardian, self.undos, self.signals = staging, guardian, undos, signals

    def _what(self, undo: str) -> str:
        return f"{undo} of process {self.pid}" if self.sub else undo

    def _in(self, base: Path) -> Path:
        return base / self.sub if self.sub else base

    @property
    def criu_dir(self) -> Path:
        return self._in(self._root / CRIU_DIR)

    @property
    def device_dir(self) -> Path:
        return self._in(self.mem if self.mem is not None else self._root / DEVICE_DIR)

    @property
    def _root(self) -> Path:
        """Where the images are written now: in memory (--live, until the write-behind) or the staging."""
        return self.live.path if self.live is not None and self.in_memory else self.staging.path

    def live_need(self) -> tuple[int, int]:
        """--live: what staging this process in memory costs: its device bytes and its tree's
        resident bytes."""
        return self.backend.describe().bytes, processes.resident_bytes([p.pid for p in self.target.tree()])

    def live_fits(self) -> bool:
        """--live: whether the images fit in memory (their size is the extra host memory it costs);
        when not, say why: the checkpoint is then an ordinary --leave-running one."""
        return live_fits([self], self.opts.live_staging, self.progress)

    def go_live(self, stage: Optional[MemStage] = None) -> None:
        """Stage the images in memory: in a MemStage of our own, or (a set member) the set's."""
        from ..backends.direct import DirectBackend

        self.live = stage if stage is not None else MemStage(self.opts.live_staging)
        self.in_memory = True
        if isinstance(self.backend, DirectBackend):  # the resume takes the device memory back in place
            self.backend.keep = True
            self.backend.snapshot_cap = self.live_cap  # backed up copy-on-write, written after the resume
            import npusim  # noqa: F401  (its first import costs 10-20 ms: not while the workload is stopped)

    def drop_live(self) -> None:
        if self.live is not None and not self.live_kept:
            self.live.remove()
        if self.snapshot is not None:
            self.snapshot.drop_snapshot()  # not written out (a failure or signal before that): freed

    def keep_device_memory(self) -> None:
        """The direct path: the daemon keeps the device memory across the backup (the Release), so
        a rollback, or --leave-running's finish, takes it back in place (milliseconds) instead of
        reading every image back; a checkpoint that kills the process leaves nothing behind (the
        daemon frees a gone process's kept memory). --live keeps it its own way.

        One process with plain images (--compress none, or auto unless a remembered verdict says
        compressing pays): the daemon also writes the images while CRIU dumps, not before it. The
        backup is then --live's copy-on-write snapshot, written out on a thread from the backup's
        end (start_writing), and the seal waits for it. The process stays locked until the commit,
        so nothing is copied aside (a cap of 0)."""
        if not self.direct or self.live is not None:
            return  # (a CPU-only checkpoint imports no device backend)
        from ..backends.direct import DirectBackend

        if not isinstance(self.backend, DirectBackend):
            return
        self.backend.keep = True
        plain = self.opts.compress == "none" or self.device_plain
        if not self.sub and self.mem is None and plain:
            self.backend.snapshot_cap = 0

    @property
    def snapshot(self) -> Optional["DirectBackend"]:
        """--live on the direct path: the backend, whose device backup is the daemon's copy-on-write
        snapshot (written out by the write-behind). Only a DirectBackend has a snapshot_cap (no
        import of the device backends on a CPU-only checkpoint's path)."""
        b = self.backend
        return cast("DirectBackend", b) if getattr(b, "snapshot_cap", None) is not None else None

    def stage_device_in_memory(self) -> None:
        """--compress on the direct path: the export goes to memory, and to the store from there
        (memstage.py); without room for it there, to the disk, uncompressed, as without --compress.
        auto, unless the chunk store's remembered verdict says compressing pays on this file system:
        to the disk as with --compress none (no staging; image/store.py: Verdict); with no verdict
        yet, a sample of those plain images is judged after the seal, for the next (probe_verdict)."""
        if not (self.direct and self.opts.compress != "none") or self.mem is not None:
            return
        if self.opts.compress == "auto":
            from ..image.store import remembered

            verdict = remembered(self.staging.final)
            self.probing = verdict is None
            self.device_plain = verdict is None or not verdict.pays
            if self.device_plain:
                return
        self.mem = memstage.create(self.backend.describe().bytes)
        if self.mem is None:
            warn(self.progress, f"no room in {memstage.DEFAULT_DIR} for process {self.pid}'s device images: "
                                "they are written uncompressed")

    def use_parent(self, parent: Path) -> None:
        """--parent: checked before anything is locked; the backend then writes only what changed."""
        from ..backends.direct import DirectBackend
        from ..image import chain

        if not isinstance(self.backend, DirectBackend):
            raise WrongState(f"--parent needs the direct data path; process {self.pid} uses {self.backend.method}",
                             "incremental checkpoints are for npusim's direct path (--data-path direct)")
        pm, above = chain.check_parent(parent, self.pid)
        if os.path.abspath(parent) == os.path.abspath(self.opts.directory):
            raise WrongState("--parent cannot be the checkpoint's own directory")
        self.parent = (parent, pm)
        self.backend.use_chain(chain.device_views(self.views, [(parent, pm), *above]))

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
        self.staging = Staging(self.opts.directory, self.opts.replace, create=False)
        self.guardian = make_staging(self.staging, self.undos, self._discard,
                                     lambda: self.services.guardian(self.staging.path, self.pid))

        def work() -> Manifest:
            for step in steps:
                step()
            return self._commit()

        try:
            return transaction(self.signals, self.undos, self.progress, work, finish)
        except BaseException:
            staged_on(self.undos)  # before the pipeline's handlers: nothing but the staging to undo
            raise
        finally:
            self.backend.release()
            self.guardian.release()
            if self.packer is not None:
                self.packer.close()
            self.release_staged()

    def release_staged(self) -> None:
        """The in-memory device images and reassembled parents, once the checkpoint is done (the
        in-memory ones are kept when they are the workload's only copy: keeps_device_data)."""
        self.views.close()
        if not getattr(self, "kept", False):
            memstage.remove(self.mem)

    # -- the steps, in order
    def lock(self) -> None:
        # Pushed before the lock: a signal may land the instant a phase returns. The undo
        # undoes whatever part of lock and backup really happened.
        self.stopped_at = time.monotonic()
        self.stage_device_in_memory()
        self.keep_device_memory()
        self.push_device_rollback()
        self.lock_device()
        self.after_lock()

    def push_device_rollback(self) -> None:
        self.undos.push(self._what("device rollback"), self._device_rollback)

    def lock_device(self) -> None:
        """The lock itself (a set runs its members' at once, one thread each)."""
        with self.phase("lock"):
            self.backend.lock(self.opts.lock_timeout, lease=self.opts.lease)

    def after_lock(self) -> None:
        if self.snapshot is not None:  # if we die, the restore takes the kept memory back
            from ..platform.simimages import daemon_socket

            self.guardian.recover_kept(daemon_socket(self.pid, getattr(self.backend, "daemon", None)),
                                       self.pid if self.sub else None)
        elif self.direct:  # if we die, it brings the device data back
            self.guardian.recover_from(self.device_dir, getattr(self.backend, "chain", []))

    def backup(self) -> None:
        self.backend.fence()  # a CLI stopped past its lease stops here, before each step
        with self.phase("backup") as t:
            if self.direct:
                self.progress(BytesExpected("backup", self.device_dir, self.backend.describe().bytes,
                                            self.phase.member))
            if self.parent is not None:
                self._check_layout(self.parent)
            self.back_up_device()
            t.bytes = self.device.bytes
            t.add_parts(getattr(self.backend, "parts", {}))
        self.start_packing()
        self.start_writing()

    def start_writing(self) -> None:
        """keep_device_memory()'s snapshot (one process, plain images) written into the staging
        directory on a thread. A failure before the seal waits for it (the files are in the
        staging, which goes next)."""
        snap = self.snapshot
        if snap is None or self.live is not None or not snap.snapped:
            return

        def write() -> list[FileEntry]:
            testhooks.pause("during:device-write", until=lambda: not snap.snapped)
            testhooks.fail("during:device-write")
            files = snap.write_snapshot(self.device_dir)
            testhooks.fail("after:device-write")
            return files

        def stop() -> None:  # a write-out still running fails at its next chunk, the files are staged
            snap.drop_snapshot()
            writing.wait()

        writing = self.writing = Background(write, "device-write")
        self.undos.push(self._what("device write-out"), stop)

    def start_packing(self) -> None:
        """--compress on the direct path: the device images go from memory to the store (or to
        DIR/device) while CRIU dumps, as a plain export's write-back overlaps the dump; the seal
        waits for it. A failure before stops it first (a set's members pack at the set's seal)."""
        if self.mem is None or not self.packs or self.sub:
            return
        from ..image.store import Packer

        packer = self.packer = Packer(self.staging.final, self.opts.compress, self.opts.dedup)
        packing = self.packing = Background(self.pack_device, "pack")

        def stop() -> None:
            packer.stop()
            packing.wait()

        self.undos.push(self._what("device packing"), stop)

    def back_up_device(self, again: bool = False) -> None:
        """The backup phase's work. again: a set's rollback backs up a member left locked between
        the members' backups (core/processset.py); what an interrupted export of its left in our
        staging goes first (the device still holds the data)."""
        if again and self.direct and self.device_dir.is_dir():
            shutil.rmtree(self.device_dir)
        if self.sub:
            self.device_dir.mkdir(0o700, exist_ok=True)
        self.device_files = self.backend.backup(self.device_dir)
        if self.mem is None and self.direct:
            testhooks.disk(sum(f.size for f in self.device_files))  # its write-back starts now
        if self.sub:  # the backend names its files as in a single checkpoint
            self.device_files = [in_member(f, self.pid) for f in self.device_files]
        self.device = self.backend.describe()

    def _check_layout(self, parent: tuple[Path, Manifest]) -> None:
        from ..errors import ImageInvalid

        now, then = self.backend.describe().devices, parent[1].device.devices
        if now != then:
            raise ImageInvalid(f"{parent[0]} holds devices {then}, process {self.pid} now uses {now}: "
                               "it cannot be its parent", "take a full checkpoint (no --parent)")

    def describe_device(self) -> None:
        """The runbook's dump: the device was backed up by earlier commands; it is only described."""
        self.device = self.backend.describe()

    def dump_locking_late(self) -> None:
        """--live: the device locked and backed up only once CRIU is about to freeze the tree (its
        pre-dump notification), after its own start-up (its kernel probes: ~35 ms here, which the
        workload then spends running, not stopped). A dump retried (a process caught exiting)
        finds it done already."""
        assert self.live is not None
        self.guardian.remove_after(self.live.path)  # first: the images in memory go if we die
        done: list[bool] = []

        def lock_and_back_up() -> None:
            if not done:
                done.append(True)
                self.lock()
                self.backup()

        self.dump(pre_dump=lock_and_back_up)

    def dump(self, pre_dump: Optional[Callable[[], None]] = None) -> None:
        with self.backend.frozen_by_criu():  # the images hold the process as the freeze found it
            self._dump(pre_dump)

    def _dump(self, pre_dump: Optional[Callable[[], None]]) -> None:
        before = self.target.tree()
        self.guardian.watch([p.pid for p in before])  # CRIU leaves them stopped: resumed if we die
        criu_dir = self.criu_dir
        if self.sub:
            criu_dir.mkdir(0o700, exist_ok=True)
        log_dir = self.log_dir or self.staging.log_dir
        # In memory (--live) nothing is hashed while CRIU writes: that would lengthen the stop.
        follow = contextlib.nullcontext() if self.in_memory else self.staging.follow(criu_dir, packing=self.packs_pages)
        with self.phase("dump") as self.dump_timing, self.signals.critical(), follow:
            self.progress(BytesExpected("dump", criu_dir, processes.resident_bytes([p.pid for p in before]),
                                        self.phase.member))
            resume = (self._what("resume"), lambda: self._run_on(criu_dir))
            pushed: list[bool] = []

            def freezing() -> None:  # after the device's undos: the tree resumes before the device is back
                if pre_dump is not None:
                    pre_dump()
                if not pushed:
                    pushed.append(True)
                    self.undos.push(*resume)

            if pre_dump is None:
                freezing()
            self.criu.dump(DumpOptions(
                pid=self.pid, images_dir=criu_dir, log_dir=log_dir,
                leave_stopped=True, shell_job=self.opts.shell_job,
                tcp_established=self.opts.tcp_established, timeout=self.opts.criu_timeout, extra=self.extra,
                started=self.guardian.wait_for_criu, pre_dump=None if pre_dump is None else freezing,
            ))
            self.tree = processes.dumped_entries(self.criu.dumped_tree(criu_dir), before)
            self.frozen = [p.pid for p in self.tree]
            self.guardian.watch(self.frozen)

    def resume_now(self) -> None:
        """--live: every image is in memory, so the workload runs on now (its device restored from
        them, unlocked), before anything reaches the disk; from here a failure costs only the
        checkpoint."""
        with self.phase("resume"), self.signals.critical():
            self._run_on(self.criu_dir)
            self.backend.finish_after_commit(self.device_dir, self._own_files())
            self.device_back = True
            self.undos.keep_only("cleanup")  # resumed and unlocked: only the staging is left to undo
            self.guardian.resumed()
        self.downtime = round(time.monotonic() - self.stopped_at, 6)

    def write_behind(self) -> None:
        """--live: the images copied from memory into the staging directory and fsync'd; the
        memory is given back at once. The seal and the commit follow, as for any checkpoint."""
        assert self.live is not None
        with self.phase("write-behind") as t:
            t.bytes += self.write_out_device()
            add_parts(t, self.snapshot_parts())
            t.bytes += self.live.write_behind(self.staging.path, lambda: testhooks.fail("during:write-behind"))
        self.in_memory = False
        self.live.remove()

    def write_out_device(self) -> int:
        """--live on the direct path, the workload running on: the daemon writes its snapshot of the
        device memory straight into the staging directory (a set member's: device/PID/); the bytes
        written (its steps: snapshot_parts()). Without a snapshot (the resume needed the images, as
        the daemon kept too little) the images are in memory, copied with the rest."""
        if (snap := self.snapshot) is None:
            return 0
        written = 0
        if snap.snapped:  # the daemon writes its snapshot to the disk at once
            target = self._in(self.staging.path / DEVICE_DIR)
            if self.sub:
                target.mkdir(0o700, exist_ok=True)
            files = snap.write_snapshot(target)
            written = sum(f.size for f in files)
            self.wrote_snapshot = True
        else:
            files = snap.images()
        self.device_files = [in_member(f, self.pid) for f in files] if self.sub else files
        self.device = snap.describe()
        testhooks.fail("during:write-behind")
        return written

    def snapshot_parts(self) -> dict[str, tuple[float, int]]:
        """The steps of the snapshot's write-out (none when there was none)."""
        snap = self.snapshot
        return dict(snap.parts) if snap is not None and self.wrote_snapshot else {}

    def seal(self) -> None:
        with self.phase("seal") as t:
            if self.writing is not None:  # its write-back ran beside CRIU's: the seal's fsync waits for both
                waited = time.monotonic()
                self.device_files = self.writing.result()
                self.device = self.backend.describe()
                written = getattr(self.backend, "parts", {}).get("export", (0.0, 0))
                t.add_parts({"device-write": written, "device-write-wait": (time.monotonic() - waited, 0)})
            if self.packs and self.packer is None:
                from ..image.store import Packer

                self.packer = Packer(self.staging.final, self.opts.compress, self.opts.dedup)
            if self.packer is not None:
                try:  # chunks cut along the memory's runs of pages; without them, at fixed offsets
                    self.packer.add_runs(self.criu_dir, page_runs(self.criu_dir))
                except (OSError, ValueError):
                    pass
            self.probe_ahead()
            device = self.packing.result() if self.packing is not None else self.pack_device()
            self.files = [f for f in device if f.chunks] + self.staging.seal(
                known=[f for f in device if not f.chunks] if self.mem is not None else self.device_files,
                packer=self.packer)
            t.bytes = self.dump_timing.bytes = sum(f.size for f in self.files if f.path.startswith(CRIU_DIR))
            t.add_parts(self.staging.parts)
            t.add_parts(self.probe_verdict())

    def _probe_sample(self) -> Optional[Path]:
        """auto with no verdict in the store yet: the largest of the device images this checkpoint
        wrote plain, the sample that judges whether compressing pays here, for the next auto
        checkpoints (store.Packer.probe); None when there is nothing to judge (any more)."""
        if not self.probing or self.packer is None or self.packer.judged or not self.device_files:
            return None
        return self.staging.path / max(self.device_files, key=lambda f: f.size).path

    def probe_ahead(self) -> None:
        """The probe's compression, started as the seal starts (the sample written, the CPUs idle)."""
        if self.packer is not None and (sample := self._probe_sample()) is not None:
            self.packer.probe_ahead(sample)

    def probe_verdict(self) -> dict[str, tuple[float, int]]:
        """The probe judged, once the seal fsync'd the images (the disk idle): the seal's step
        `probe`, if it ran."""
        if self.packer is None or (sample := self._probe_sample()) is None:
            return {}
        started = time.monotonic()
        self.packer.probe(sample)
        return {"probe": (time.monotonic() - started, 0)}

    def pack_device(self) -> list[FileEntry]:
        """--compress: the device images staged in memory go into the chunk store (their entries,
        packed), or, where auto found that compressing does not pay here, into DIR/device as they
        are. They stay in memory for --leave-running's import after the commit. auto after a
        remembered "plain wins": the export is in DIR/device already, and recorded as left plain."""
        if self.packer is not None and self.mem is None and self.device_plain:
            self.packer.device_stats.plain_bytes += sum(f.size for f in self.device_files)
            if not self.probing:  # else the probe says "probed" once it has judged (probe_verdict)
                self.packer.device_stats.verdict = "remembered"
            return []
        if self.mem is None or self.packer is None:
            return []
        out = []
        for f in self.device_files:
            src = self.mem / Path(*Path(f.path).parts[1:])
            packed = self.packer.device_image(src, self.staging.path / f.path, f)
            if packed is None:
                self.packer.device_stats.plain_bytes += f.size
            out.append(packed or f)
        return out

    @property
    def packs(self) -> bool:
        """Whether the checkpoint uses the chunk store (--dedup, --compress)."""
        return self.opts.dedup or self.opts.compress != "none"

    @property
    def packs_pages(self) -> bool:
        """Whether CRIU's page images go to the chunk store (store.Packer.takes): --dedup or a named
        codec. auto leaves them where CRIU wrote them, so their write-back starts while CRIU
        writes them, as with --compress none (left for the seal, the fsync waited for all of it)."""
        return self.opts.dedup or self.opts.compress in ("zstd", "lz4")

    def _commit(self) -> Manifest:
        return commit(self.staging, self.signals, self._manifest(), self.guardian, not self.opts.leave_running)

    # -- after the commit
    def finish_checkpoint(self, manifest: Manifest) -> None:
        if not self.opts.leave_running:
            processes.kill(self.frozen)
            return
        self.run_on_after_commit()
        self.device_after_commit()

    def run_on_after_commit(self, root: Optional[Path] = None) -> None:
        """--leave-running: the tree runs on (a set resumes every member's before any device restore).
        root: where its images are (default: the committed directory; a set that runs on at its
        seal: the staging path)."""
        self._run_on(self._in((root or self.staging.final) / CRIU_DIR))

    def device_after_commit(self, root: Optional[Path] = None) -> None:
        """--leave-running: the device restored and unlocked, from the committed directory (the
        staging path has moved), or from root."""
        committed = self.mem if self.mem is not None else (root or self.staging.final) / DEVICE_DIR
        self.backend.finish_after_commit(self._in(committed), self._own_files())

    def _own_files(self) -> list[FileEntry]:
        """The device files as the backend named them (a set member's without their PID/)."""
        from ..image.format import member_relative

        return [member_relative(f) for f in self.device_files] if self.sub else self.device_files

    def finish_dump(self, manifest: Manifest) -> None:
        if not self.opts.leave_running:
            processes.kill(self.frozen)
            return
        self._run_on(self._in(self.staging.final / CRIU_DIR))

    # -- helpers and undos
    def _manifest(self) -> Manifest:
        opts = self.opts
        return Manifest(
            parent=self._parent_ref(),
            pid=self.pid,
            created=datetime.now(timezone.utc).isoformat(timespec="microseconds"),  # prune orders by it
            host=os.uname().nodename,  # gethostname(), without socket.py's imports
            kernel=os.uname().release,
            npusnap_version=__version__,
            criu_version=self.criu.binary.version_str,
            command=self.target.command,
            options={"shell_job": opts.shell_job, "tcp_established": opts.tcp_established,
                     "leave_running": opts.leave_running, **self.extra.recorded(),
                     **({"live": {"downtime_s": self.downtime}} if self.downtime is not None else {}),
                     **({"host_pages": self.packer.stats.recorded(opts.compress)} if self.packer else {}),
                     **({"device_images": self.packer.device_stats.recorded(opts.compress)}
                        if self.packer and (self.mem is not None or self.device_plain) else {})},
            processes=self.tree,
            device=self.device,
            phases=self.phase.timings,
            files=self.files,
        )

    def _parent_ref(self) -> Optional[ParentRef]:
        """An incremental's reference to its parent (image/chain.py, and the chunk store with it,
        imported only then)."""
        if self.parent is None:
            return None
        from ..image.chain import parent_ref

        return parent_ref(self.opts.published or self.staging.final, self.parent[0])

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
        kept = self.keeps_device_data()
        self.live_kept = kept and self.in_memory  # then it is the memory's copy that stays
        if not kept or self.in_memory:
            self.staging.discard()

    def keeps_device_data(self) -> bool:
        """After a rollback: whether the staged device data is still the workload's only copy
        (a failed put-back). Then it is never deleted (no manifest: it does not look valid)."""
        try:
            staged = not self.staging.committed and self.device_dir.is_dir() and any(self.device_dir.iterdir())
        except OSError:
            staged = False
        if self.device_back or not staged or not process_exists(self.pid, zombies_count=False):
            return False  # put back, nothing staged, or nobody left to need it
        chain = "".join(f" --parent-images {p}" for p in getattr(self.backend, "chain", []))
        self.kept = True
        self.views.pop_all()  # the reassembled parents, too, for that command
        warn(self.progress, f"the device data of process {self.pid} stays in {self.device_dir}: "
                            f"`npusnap recover {self.pid} --device-images {self.device_dir}{chain}` puts it back")
        return True
