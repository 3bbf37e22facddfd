"""A process set: several independent process trees on one host, checkpointed as ONE consistent
checkpoint (one directory, one manifest, all or nothing) and restored as one. The per-node worker
of a multi-node job runs this; `npusnap checkpoint PID PID ...` is its command.

    checkpoint:  lock every member at once (one thread each: the set's skew is one lock's time)
                 -> back up each, all at once -> dump each, all at once (CRIU: one tree per dump, criu/PID/;
                 one after another with --tcp-established) -> seal -> commit the set's manifest
                 -> kill all | run all on (--leave-running)
    live:        every member's CRIU started, each waiting at its pre-dump notification -> lock
                 every member -> back up each (the direct path: the daemon's copy-on-write
                 snapshot) -> every dump goes on, all into one MemStage (image/memstage.py) ->
                 every member runs on, unlocked (the set's downtime: until the last one does) ->
                 write-behind of every member's images -> seal -> commit (--live)
    restore:     verify -> every member's CRIU restore, all at once (one after another for shell
                 jobs and --tcp-established) -> each member's device restore (it stays LOCKED;
                 HCCL ranks' at once) -> unlock every member (the commit point)

Each member is a core.checkpoint.CheckpointRun whose steps the set drives; they share one staging
directory, one undo stack, one guardian and one set of signal handlers, so any failure, timeout or
Ctrl-C before the commit undoes every member (device restored and unlocked, tree resumed) and
leaves no checkpoint. Members holding HCCL communicators are handed one rendezvous directory of
the set's before their lock, and every in-place device restore of theirs (the rollback, running on
after the commit, an agent whose lease ran out, the guardian's recovery) runs at once through it:
a rank's restore re-forms its communicators, which waits for its peers'. A restore that fails
kills every member restored so far; the checkpoint stays intact for a retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Protocol, Sequence

from .. import testhooks
from ..backends import Backend, BackendName, DataPath, State, unlock_unless_running
from ..errors import NpusnapError, UnsupportedTarget, WrongState
from ..image.format import (
    CRIU_DIR,
    DEVICE_DIR,
    SET_FORMAT_VERSION,
    FileEntry,
    Manifest,
    MemberEntry,
    PhaseTiming,
    restore_log_dir,
    set_device,
)
from ..image.memstage import MemStage
from ..image.packed import assembled
from ..image.staging import Staging
from ..image.store import Packer
from ..platform.criu import LazyPages
from ..platform.criuimages import page_runs
from . import communicators, processes
from .checkpoint import (
    CheckpointOptions,
    CheckpointRun,
    add_parts,
    commit,
    live_fits,
    make_staging,
    staged_on,
    transaction,
)
from .lazy import LazyRestore
from .progress import Event, Phases, Progress, quiet, warn
from .restore import (
    RESTORE_LEASE_S,
    RestoreOptions,
    _refuse_pids_in_use,
    _restore_options,
    _unlock_closed_connections,
    _verified,
    hand_daemon,
    lazy_restore,
    lazy_supported,
    on_daemon,
    refuse_lazy,
    use_lazy,
)
from .services import REAL, CriuDriver, GuardianLike, ImagesViewLike, Services
from .signals import Signals
from .undo import UndoStack

LOG_NAMES_OF_A_DUMP = ("dump.log", "stats-dump")  # what CRIU writes into a dump's log directory


class CommitGate(Protocol):
    """A multi-node job's two-phase commit around the set's own (core/job/worker.py)."""

    def prepared(self, manifest: Manifest) -> None:
        """Everything dumped and sealed, nothing committed: vote, and wait for the decision.
        Raising aborts: every member is undone as for any failure."""

    def committed(self, manifest: Manifest) -> Optional[Path]:
        """The set is committed, no member killed or run on yet: wait until the job is. Where the
        set's committed directory is now (the job's commit renames the directory above it), or
        None: where the set committed it."""

    def failing(self, error: BaseException) -> None:
        """The set failed before its commit and every member is about to be undone: tell the job
        now, not after the rollback (its other nodes' HCCL ranks must roll back meanwhile, or
        ours wait for them in vain). Never raises."""


def checkpoint_set(pids: Sequence[int], opts: CheckpointOptions, progress: Progress = quiet,
                   services: Services = REAL, gate: Optional[CommitGate] = None) -> Manifest:
    """Checkpoint every pid (each with its process tree) into opts.directory as one set.
    Raises NpusnapError, naming the member that failed, after undoing every member."""
    return SetCheckpoint(pids, opts, progress, services, gate).execute()


@contextlib.contextmanager
def _naming(pid: int, index: int, count: int) -> Iterator[None]:
    """An error names the member it came from, and its place in the set (once)."""
    try:
        yield
    except NpusnapError as e:
        if not getattr(e, "names_member", False):
            e.message = f"process {pid} (set member {index + 1} of {count}): {e.message}"
            e.args = (e.message,)
            e.names_member = True  # type: ignore[attr-defined]
        raise


class NotLocked(Exception):
    """A member's CRIU told to give up at its pre-dump notification: the set was not locked (another
    member failed, or the lock did). Never the failure reported: that one is."""


class PreDumpGate:
    """--live: the members' CRIUs, each waiting at its pre-dump notification (in its member's
    thread), and the set's lock, taken once all are there (in the main thread)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = set(pids)
        self.arrived: set[int] = set()
        self.failed = False  # a member's thread ended before its notification: its CRIU failed
        self.verdict: Optional[bool] = None
        self.cond = threading.Condition()

    def arrive(self, pid: int) -> None:
        """A member's CRIU is at its pre-dump notification: wait for the verdict (a dump retried
        after a process caught exiting finds it given)."""
        with self.cond:
            self.arrived.add(pid)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.verdict is not None)
            if not self.verdict:
                raise NotLocked("the set was not locked")

    def ended(self, pid: int) -> None:
        with self.cond:
            if pid not in self.arrived:
                self.failed = True
            self.cond.notify_all()

    def wait_all(self) -> bool:
        """Until every member's CRIU is at its notification (True), or one failed before it."""
        with self.cond:
            self.cond.wait_for(lambda: self.failed or self.arrived >= self.pids)
            return not self.failed

    def open(self, locked: bool) -> None:
        with self.cond:
            self.verdict = locked
            self.cond.notify_all()


def at_once(keys: Iterable[int], work: Callable[[int], None],
            ended: Callable[[int], None] = lambda key: None) -> Callable[[], dict[int, BaseException]]:
    """work(key) started for every key (a member's pid or place) at once, one thread each, each
    calling ended(key) last; returns what waits for them all and gives the failures by key (for
    the caller to report in member order)."""
    failed: dict[int, BaseException] = {}

    def one(key: int) -> None:
        try:
            work(key)
        except BaseException as e:
            failed[key] = e
        finally:
            ended(key)

    threads = [threading.Thread(target=one, args=(key,), name=f"member-{key}") for key in keys]
    for th in threads:
        th.start()

    def join() -> dict[int, BaseException]:
        for th in threads:
            th.join()
        return failed

    return join


def raise_first(order: Iterable[int], failed: dict[int, BaseException]) -> None:
    """The first failure in order (member order) of those at_once() gave; a member that only
    stopped because another failed (NotLocked) never hides the failure itself."""
    for key in order:
        error = failed.get(key)
        if error is not None and not isinstance(error, NotLocked):
            raise error


def _serialized(progress: Progress) -> Progress:
    """The members' locks report from their own threads: one event at a time."""
    lock = threading.Lock()

    def report(event: Event) -> None:
        with lock:
            progress(event)

    return report


class SetCheckpoint:
    def __init__(self, pids: Sequence[int], opts: CheckpointOptions, progress: Progress,
                 services: Services, gate: Optional[CommitGate] = None) -> None:
        self.gate = gate
        if not pids:
            raise WrongState("a process set needs at least one process")
        twice = sorted({p for p in pids if list(pids).count(p) > 1})
        if twice:
            raise UnsupportedTarget(f"process {twice[0]} is named twice; a set holds each process once",
                                    "name every process of the set once")
        self.opts, self.services = opts, services
        self.progress = _serialized(progress)
        self.members: list[CheckpointRun] = []
        for i, pid in enumerate(pids):
            with _naming(pid, i, len(pids)):
                self.members.append(CheckpointRun(pid, opts, self.progress, services, opts.data_path, member=True))
        self._refuse_overlaps()
        for m in self.members:
            with self._member(m):
                m.expect(State.RUNNING)
        if opts.parent is not None:
            self._use_parent(opts.parent)
        # Every rank of each member's HCCL communicators must be in the set (or --force).
        if not opts.peers_elsewhere:  # a job's node: its workers checkpoint the other ranks meanwhile
            communicators.admit({m.pid: m.backend for m in self.members}, opts.force, self.progress)
        self.phase = Phases(self.progress)
        self.undos = UndoStack(lambda text: warn(self.progress, text))
        self.signals = Signals()
        self.locked_at = 0.0  # monotonic: when the members' locks began
        self.downtime: dict[int, float] = {}  # each member that ran on: seconds from the lock to running
        self.ran_on = False  # opts.run_on_at_seal: every member runs on already
        self.live: Optional[MemStage] = None  # --live: where every member's images are until the write-behind
        self.live_downtime: Optional[float] = None  # --live: from the lock until the last member runs on

    def _refuse_overlaps(self) -> None:
        """A member inside another member's tree would be dumped twice (and CRIU refuses a
        tree whose part is already stopped): refused before anything is locked."""
        pids = {m.pid for m in self.members}
        for m in self.members:
            for p in m.target.tree()[1:]:
                if p.pid in pids:
                    raise UnsupportedTarget(
                        f"process {p.pid} is a descendant of process {m.pid}: it is checkpointed with "
                        f"{m.pid}'s tree and cannot be a member of the set as well",
                        f"leave {p.pid} out of the list (it comes with {m.pid})")

    def _use_parent(self, parent: Path) -> None:
        """--parent (a job's node: the parent job checkpoint's node): every member writes only what
        changed since its own images in parent, a checkpoint of the same set; checked before anything
        is locked. A compressed chain is reassembled once, for every member."""
        from ..backends.direct import DirectBackend
        from ..image import chain

        for m in self.members:
            if not isinstance(m.backend, DirectBackend):
                raise WrongState(f"--parent needs the direct data path; process {m.pid} uses {m.backend.method}",
                                 "incremental checkpoints are for npusim's direct path (--data-path direct)")
        pm, above = chain.check_set_parent(parent, [m.pid for m in self.members])
        if os.path.abspath(parent) == os.path.abspath(self.opts.directory):
            raise WrongState("--parent cannot be the checkpoint's own directory")
        views = chain.device_views(self.members[0].views, [(parent, pm), *above])
        for m in self.members:
            entry = next(e for e in pm.members if e.pid == m.pid)
            m.parent = (parent, dataclasses.replace(pm, device=entry.device))  # its layout, checked at its backup
            assert isinstance(m.backend, DirectBackend)
            m.backend.use_chain([v / entry.subdir for v in views])

    def _member(self, m: CheckpointRun) -> contextlib.AbstractContextManager[None]:
        return _naming(m.pid, self.members.index(m), len(self.members))

    # -- the pipeline
    def execute(self) -> Manifest:
        first = self.members[0]
        live = self.opts.live and self.opts.leave_running and live_fits(self.members, self.opts.live_staging,
                                                                        self.progress)
        try:
            return self._execute(first, live)
        finally:
            for m in self.members:  # the snapshots never written out dropped, the memory given back
                m.drop_live()
            if self.live is not None and not any(m.live_kept for m in self.members):
                self.live.remove()  # also when no member was handed it yet

    def _execute(self, first: CheckpointRun, live: bool) -> Manifest:
        self.staging = Staging(self.opts.directory, self.opts.replace, create=False)
        self.guardian = make_staging(self.staging, self.undos, self._discard,
                                     lambda: self.services.guardian(self.staging.path, first.pid))
        try:
            if live:  # one directory in memory for the set (criu/PID/, device/PID/), removed if we die
                self.live = MemStage(self.opts.live_staging)
                self.guardian.remove_after(self.live.path)
                for m in self.members:
                    m.go_live(self.live)
            for m in self.members:
                m.share(self.staging, self.guardian, self.undos, self.signals)
            # Removed once every member is back or gone (by the guardian if we die).
            with self._rendezvous() as self.meet:
                return transaction(self.signals, self.undos, self.progress, self._work, self._finish)
        except BaseException:
            staged_on(self.undos)  # before the pipeline's handlers: nothing but the staging to undo
            raise
        finally:
            for m in self.members:
                m.backend.release()
            self.guardian.release()
            if self.members[0].packer is not None:
                self.members[0].packer.close()
            for m in self.members:
                m.release_staged()

    def _rendezvous(self) -> contextlib.AbstractContextManager[Optional[Path]]:
        """Where the set's HCCL ranks meet in an in-place restore: a job's directory (their peers on
        the other nodes restore through it too; the coordinator removes it), else a private one."""
        if self.opts.rendezvous is not None:
            return contextlib.nullcontext(self.opts.rendezvous if self._hccl else None)
        return communicators.rendezvous(self._hccl, _owner(self.members[0].pid))

    @property
    def _hccl(self) -> bool:
        """Whether some member holds a communicator of more than one rank."""
        return any(c.ranks > 1 for m in self.members for c in communicators.held_by(m.backend))

    def _at_once(self, work: Callable[[CheckpointRun], None]) -> dict[int, BaseException]:
        """work(member) for every member at once, one thread each (all bounded by their own
        deadlines); the failures by member pid."""
        return self._started(work)()

    def _started(self, work: Callable[[CheckpointRun], None],
                 ended: Callable[[int], None] = lambda pid: None) -> Callable[[], dict[int, BaseException]]:
        """work(member) started for every member (at_once), each under its name in errors."""
        by_pid = {m.pid: m for m in self.members}

        def named(pid: int) -> None:
            with self._member(by_pid[pid]):
                work(by_pid[pid])

        return at_once(list(by_pid), named, ended)

    def _raise_first(self, failed: dict[int, BaseException]) -> None:
        raise_first([m.pid for m in self.members], failed)

    def _devices_back(self) -> None:
        """The set's device rollback: every member's at once (an HCCL rank's restore waits for its
        peers' in the set's rendezvous directory); each failure reported, none stops the others."""
        self._back_up_locked_ranks()
        if self.meet is not None:
            self.guardian.restoring()
        failed = self._at_once(lambda m: m._device_rollback())
        for m in self.members:
            if m.pid in failed:
                warn(self.progress, f"rollback: device rollback failed: {failed[m.pid]}")

    def _back_up_locked_ranks(self) -> None:
        """A failure or Ctrl-C between the members' backups leaves some HCCL ranks backed up (gone
        from their communicators) and others only locked (still in them). A backed-up rank's restore
        re-forms its communicators, which needs every peer to rejoin: so the locked ranks are backed
        up too, and the rollback's restores then re-form the communicators together."""
        if self.meet is None:
            return
        states: dict[int, Optional[State]] = {}
        for m in self.members:
            try:
                if any(c.ranks > 1 for c in communicators.held_by(m.backend)):
                    states[m.pid] = m.backend.state()
            except NpusnapError:  # its own rollback reports it
                states[m.pid] = None
        if State.BACKED_UP not in states.values():
            return
        locked = {pid for pid, state in states.items() if state == State.LOCKED}
        failed = self._at_once(lambda m: m.back_up_device(again=True) if m.pid in locked else None)
        for m in self.members:
            if m.pid in failed:
                warn(self.progress, f"rollback: backing up the locked HCCL rank failed: {failed[m.pid]}")

    def _work(self) -> Manifest:
        try:
            return self._steps()
        except BaseException as e:
            if self.gate is not None:  # before the rollback: see CommitGate.failing
                self.gate.failing(e)
            raise

    def _steps(self) -> Manifest:
        if self.meet is not None:  # before the lock: an agent whose lease runs out restores through it
            self.guardian.meet(self.meet, [m.pid for m in self.members], owned=self.opts.rendezvous is None)
            for m in self.members:
                with self._member(m):
                    communicators.hand(m.backend, self.meet)
        if self.live is not None and self._dumps_at_once:
            self._dump_locking_late()
        else:
            self._lock_all()
            self._back_up_all()
            with self.phase("dump") as self.dump_timing:
                self._dump_all()
        if self.live is not None:
            self._resume_now()
            self._write_behind()
        self._seal()
        manifest = self._manifest()
        if self.opts.run_on_at_seal and not self.ran_on:  # --live ran on before its write-behind
            self._run_on_at_seal()
        if self.gate is not None:
            self.gate.prepared(manifest)
        return commit(self.staging, self.signals, manifest, self.guardian if self.gate is None else None,
                      not self.opts.leave_running)

    def _lock_all(self) -> None:
        """Every member's lock at once. Signals wait until every lock has returned (each is
        bounded by --lock-timeout): an undo must never race a lock still in flight."""
        for m in self.members:
            m.stage_device_in_memory()
            m.keep_device_memory()
        self.undos.push("device rollback", self._devices_back)
        self.locked_at = time.monotonic()
        with self.phase("lock"), self.signals.critical():
            self._raise_first(self._at_once(lambda m: m.lock_device()))  # each named by its member
        for m in self.members:
            m.after_lock()

    def _back_up_all(self) -> None:
        """Every member's backup at once (its export to the disk, or its agent's copy to host
        memory, runs in its own process or the daemon's threads). Signals wait until every backup
        has returned: an undo must never race one in flight."""
        with self.phase("backup") as t:
            with self.signals.critical():
                failed = self._at_once(lambda m: m.backup())
            self._raise_first(failed)
            t.bytes = sum(m.device.bytes for m in self.members)

    @property
    def _dumps_at_once(self) -> bool:
        """Every member's CRIU dump runs at once, one thread each: their start-ups (~35 ms of kernel
        probes each here) overlap. One after another with --tcp-established: each dump takes
        CRIU's network lock (iptables rules) of its own."""
        return len(self.members) > 1 and not self.opts.tcp_established

    def _dump_all(self) -> None:
        if not self._dumps_at_once:
            for m in self.members:
                self._dump(m)
            return
        with self.signals.critical():  # an undo must never race a dump in flight
            failed = self._at_once(self._dump)
        self._raise_first(failed)

    def _dump_locking_late(self) -> None:
        """--live: every member's CRIU starts at once, and each waits at its pre-dump notification
        (its start-up done, nothing frozen yet) until every member is locked and backed up; then
        all dump at once. The set's downtime holds no CRIU start-up. Signals wait until every
        dump has returned; a member whose CRIU fails before its notification fails the set
        before anything is locked."""
        gate = PreDumpGate([m.pid for m in self.members])
        with self.phase("dump") as self.dump_timing, self.signals.critical():
            join = self._started(lambda m: self._dump(m, pre_dump=lambda: gate.arrive(m.pid)), gate.ended)
            error: Optional[BaseException] = None
            if gate.wait_all():
                try:
                    self._lock_all()
                    self._back_up_all()
                except BaseException as e:  # raised once every CRIU has given up
                    error = e
            gate.open(error is None and not gate.failed)
            failed = join()
        if error is not None:
            raise error
        self._raise_first(failed)

    def _dump(self, m: CheckpointRun, pre_dump: Optional[Callable[[], None]] = None) -> None:
        # CRIU names its log dump.log: each member dumps into a log directory of its own, and
        # its logs join the set's as dump-PID.log once the dump succeeded (a failed one's log
        # stays where the error points).
        m.log_dir = self.staging.log_dir / str(m.pid)
        m.log_dir.mkdir(0o700, exist_ok=True)
        with self._member(m):
            m.dump(pre_dump)
        for name in LOG_NAMES_OF_A_DUMP:
            with contextlib.suppress(FileNotFoundError):
                (m.log_dir / name).rename(self.staging.log_dir / _member_log(name, m.pid))
        for leftover in m.log_dir.iterdir():  # nothing else is expected; never left to break the commit
            leftover.unlink()
        m.log_dir.rmdir()

    def _resume_now(self) -> None:
        """--live: every member's images are in memory, so every member runs on now, as after the
        commit of a --leave-running set (every tree first, then every device restored and unlocked
        at once: an HCCL rank's restore re-forms its communicators, which waits for its peers');
        from here a failure costs only the checkpoint. One that fails to run on fails the set,
        before anything reached the disk: the rollback undoes every member."""
        assert self.live is not None
        with self.phase("resume"), self.signals.critical():
            self._raise_first(self._run_all_on(self.live.path))  # each named by its member
            for m in self.members:
                m.device_back = True
            self.ran_on = True  # nothing left for after the commit
            self.undos.keep_only("cleanup")  # every member resumed and unlocked: only the staging is left
            self.guardian.resumed()
        self.live_downtime = max(self.downtime.values(), default=None)

    def _write_behind(self) -> None:
        """--live: every member's device snapshot written out by the daemon (at once: a member that
        writes where its snapshot was not yet passed waits for it), then the images in memory copied
        into the staging directory and fsync'd, the memory given back; the seal and the commit follow."""
        assert self.live is not None
        with self.phase("write-behind") as t:
            written: dict[int, int] = {}

            def out(m: CheckpointRun) -> None:
                written[m.pid] = m.write_out_device()

            with self.signals.critical():  # as one process's: a signal waits for the daemon's write-outs
                failed = self._at_once(out)
            self._raise_first(failed)
            t.bytes = sum(written.values())
            for m in self.members:
                add_parts(t, m.snapshot_parts())
            t.bytes += self.live.write_behind(self.staging.path, lambda: testhooks.fail("during:write-behind"))
        for m in self.members:
            m.in_memory = False
        self.live.remove()

    def _seal(self) -> None:
        with self.phase("seal") as t:
            packer = self._packer()
            for m in self.members:
                m.probe_ahead()  # auto's first here: one member's images judged (the first with any)
            device = [f for m in self.members for f in m.pack_device()]
            kept = [f for f in device if not f.chunks]  # auto: not compressed after all, in DIR as they are
            files = [f for f in device if f.chunks] + self.staging.seal(
                known=[*kept, *(f for m in self.members if m.mem is None for f in m.device_files)], packer=packer)
            for m in self.members:
                m.files = [f for f in files if f.path.startswith(f"{CRIU_DIR}/{m.pid}/")]
                m.dump_timing.bytes = sum(f.size for f in m.files)
                t.add_parts(m.probe_verdict())
            t.bytes = self.dump_timing.bytes = sum(m.dump_timing.bytes for m in self.members)
            self.files = files

    def _packer(self) -> Optional[Packer]:
        """--dedup, --compress: one chunk store packer for the set, shared by its members (the
        first member's manifest records its figures)."""
        first = self.members[0]
        if not first.packs:
            return None
        packer = Packer(self.staging.final, self.opts.compress, self.opts.dedup)
        for m in self.members:
            m.packer = packer
            try:  # each member's page images cut along its memory's runs of pages
                packer.add_runs(m.criu_dir, page_runs(m.criu_dir))
            except (OSError, ValueError):
                pass
        return packer


    def _manifest(self) -> Manifest:
        first = self.members[0]._manifest()  # host, versions, options: the same for every member
        members = [MemberEntry(pid=m.pid, command=m.target.command, processes=m.tree, device=m.device,
                               phases=m.phase.timings) for m in self.members]
        options = dict(first.options)
        if self.live_downtime is not None:  # the set's: until its last member ran on
            options["live"] = {"downtime_s": self.live_downtime}
        return dataclasses.replace(
            first, options=options, processes=[p for m in self.members for p in m.tree],
            device=set_device([m.device for m in self.members]), phases=self.phase.timings,
            files=self.files, format_version=SET_FORMAT_VERSION, members=members)

    def _finish(self, manifest: Manifest) -> None:
        """After the commit: every member killed, or every member run on (--leave-running). One
        member's failure to run on does not keep the others from it; the first is reported."""
        moved = self.gate.committed(manifest) if self.gate is not None else None
        failed: dict[int, BaseException] = {}

        def each(step: Callable[[CheckpointRun], None]) -> None:
            for m in self.members:
                try:
                    with self._member(m):
                        step(m)
                except Exception as e:
                    failed.setdefault(m.pid, e)

        if not self.opts.leave_running:
            each(lambda m: m.finish_checkpoint(manifest))
        elif not self.ran_on:
            failed.update(self._run_all_on(moved))
        first: Optional[BaseException] = None
        for m in self.members:
            if m.pid in failed:
                warn(self.progress, str(failed[m.pid]))
                first = first or failed[m.pid]
        if first is not None:
            raise first

    def _run_all_on(self, root: Optional[Path]) -> dict[int, BaseException]:
        """Every member runs on, its device restored and unlocked from root's images (None: the
        committed directory); the failures by pid. Every tree runs before any device restore (an
        HCCL rank's waits for its peers'). Each member that runs on gets a `resume` phase and
        its downtime (from the set's lock until it runs, unlocked)."""
        failed: dict[int, BaseException] = {}
        started = time.monotonic()
        for m in self.members:
            try:
                with self._member(m):
                    m.run_on_after_commit(root)
            except Exception as e:
                failed[m.pid] = e
        stuck = set(failed)  # a tree that did not resume is not restored (its peers then fail)
        if self.meet is not None:
            self.guardian.restoring()

        def device(m: CheckpointRun) -> None:
            if m.pid in stuck:
                return
            m.device_after_commit(root)
            now = time.monotonic()
            m.phase.timings.append(PhaseTiming("resume", round(now - started, 6)))
            self.downtime[m.pid] = round(now - self.locked_at, 6)

        for pid, error in self._at_once(device).items():
            failed.setdefault(pid, error)
        return failed

    def _run_on_at_seal(self) -> None:
        """A job's node staged locally with --leave-running: every member runs on from the sealed
        staging directory, before its write-behind and its vote, so the ranks' downtime does not
        include the shared storage. An abort after this has nothing left to undo on the members
        (running on, unlocked, is what an abort leaves them in; their work since goes on): their
        undos are spent, only the cleanup of the checkpoint is left."""
        # rolled back: the members that run on already are left as they are
        self._raise_first(self._run_all_on(self.staging.path))
        self.ran_on = True
        self.undos.keep_only("cleanup")

    def _discard(self) -> None:
        # every member warns for itself (one not yet handed the staging has nothing staged)
        kept = [m.pid for m in self.members if hasattr(m, "staging") and m.keeps_device_data()]
        in_memory = any(m.in_memory for m in self.members)
        if kept and in_memory:  # --live: the set's memory holds a member's only copy: it stays
            for m in self.members:
                m.live_kept = True
        if not kept or in_memory:
            self.staging.discard()


def _owner(pid: int) -> Optional[int]:
    """The uid of a member's process (None if it is gone: its lock then fails by itself)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _member_log(name: str, pid: int) -> str:
    stem, dot, ext = name.partition(".")
    return f"{stem}-{pid}{dot}{ext}"


# ---------------------------------------------------------------- restore


@dataclass
class MemberRestored:
    checkpointed: int  # the member's pid in the checkpoint (CRIU restores it under the same pid)
    pid: int
    phases: list[PhaseTiming] = field(default_factory=list)


@dataclass
class SetRestoreResult:
    manifest: Manifest
    members: list[MemberRestored]
    phases: list[PhaseTiming] = field(default_factory=list)
    lazy: list[LazyRestore] = field(default_factory=list)  # --lazy: each member's, in member order (finish() each)


def restore_set(opts: RestoreOptions, progress: Progress = quiet, services: Services = REAL) -> SetRestoreResult:
    """Restore every member of the set in opts.directory, or none: a failure, timeout or Ctrl-C
    before the last unlock kills the members restored so far (the checkpoint stays intact).
    Each restored root becomes our child."""
    root = opts.directory.absolute()
    phase = Phases(progress)
    # pages: every member's page images, checked while CRIU reads them (each tree left stopped until all match)
    manifest, pages = _verified(root, opts, phase)
    if not manifest.is_set:
        raise WrongState(f"{opts.directory} holds one process's checkpoint, not a set")
    if opts.criu_only:
        raise WrongState("--criu-only is a runbook step for one process; a set is restored whole",
                         "restore the set without --criu-only")
    if opts.lazy:
        refuse_lazy(root, manifest, opts)
    for entry in manifest.members:
        services.device_fits(on_daemon(entry.device, opts))
    _refuse_pids_in_use(manifest)
    criu = services.criu(opts.criu_path)
    if opts.lazy:
        lazy_supported(criu)
    services.become_subreaper()
    restored: dict[int, tuple[MemberEntry, int]] = {}  # the roots to kill on failure, by checkpointed pid
    servers: dict[int, LazyPages] = {}  # --lazy: each member's page server, by its checkpointed pid
    backends: list[Optional[Backend]] = []
    results: list[MemberRestored] = []
    guardian = services.guardian(None, manifest.pid)
    try:
        with Signals() as signals, services.images_view() as view:
            try:
                guardian.kill_if_dead([p.pid for p in manifest.processes])
                phases = [Phases(progress, member=entry.pid) for entry in manifest.members]
                results.extend(MemberRestored(e.pid, e.pid, p.timings) for e, p in zip(manifest.members, phases))

                def criu_restore(i: int) -> None:
                    entry = manifest.members[i]
                    with _naming(entry.pid, i, len(manifest.members)):
                        results[i].pid = _restore_member(entry, manifest, root, opts, criu, view, guardian,
                                                         phases[i], signals, progress, restored, servers,
                                                         leave_stopped=pages is not None)

                try:
                    _criu_restores(manifest, criu_restore, signals)
                except NpusnapError:
                    if pages is not None:
                        pages.result()  # a corrupt page image explains CRIU's failure best
                    raise
                for entry in manifest.members:  # in member order, as the backends will be
                    restored[entry.pid] = restored.pop(entry.pid)
                if pages is not None:  # every tree is stopped, as CRIU left it: each runs only on good pages
                    pages.result()
                    for entry, pid in restored.values():
                        processes.resume(pid, [p.pid for p in entry.processes])
                # Every member's process exists first, then their device restores (HCCL ranks' at once:
                # each re-forms its communicators, which waits for its peers').
                ready = [(e, r.pid, p) for e, r, p in zip(manifest.members, results, phases)]
                _device_restores(ready, manifest, root, opts, progress, services, backends, guardian)
                with phase("unlock"), signals.critical():  # every member runs, or none
                    for (entry, _), backend in zip(restored.values(), backends):  # in member order, both
                        if backend is not None:
                            with _naming(entry.pid, manifest.members.index(entry), len(manifest.members)):
                                unlock_unless_running(backend)
                signals.settled = True
            except BaseException:
                signals.rolling_back = True
                for entry, pid in reversed(restored.values()):
                    processes.kill_tree(pid, list(dict.fromkeys([pid, *(p.pid for p in entry.processes)])))
                for server in servers.values():
                    server.kill()
                raise
            finally:
                for b in backends:
                    if b is not None:
                        b.release()
    finally:
        guardian.release()
    lazy = [lazy_restore(pid, [p.pid for p in entry.processes], servers.get(entry.pid), entry.device, opts,
                         sum(f.size for f in entry.files(manifest) if f.path.startswith(f"{CRIU_DIR}/")))
            for entry, pid in restored.values()] if opts.lazy else []
    return SetRestoreResult(manifest, results, phase.timings, lazy)


def _criu_restores(manifest: Manifest, criu_restore: Callable[[int], None], signals: Signals) -> None:
    """criu_restore(i) for every member: all at once, one thread each (their CRIUs' start-ups
    overlap); one after another for shell jobs and --tcp-established (a terminal to hand over,
    CRIU's network unlock for each). Signals wait until every restore has returned: a rollback
    must never race a CRIU still restoring."""
    count = len(manifest.members)
    if count == 1 or manifest.options.get("shell_job") or manifest.options.get("tcp_established"):
        for i in range(count):
            criu_restore(i)
        return
    with signals.critical():
        failed = at_once(range(count), criu_restore)()
    raise_first(range(count), failed)


def _restore_member(entry: MemberEntry, manifest: Manifest, root: Path, opts: RestoreOptions, criu: CriuDriver,
                    view: ImagesViewLike, guardian: GuardianLike, phase: Phases, signals: Signals, progress: Progress,
                    restored: dict[int, tuple[MemberEntry, int]], servers: dict[int, "LazyPages"],
                    leave_stopped: bool) -> int:
    log_dir = restore_log_dir(root)  # one fresh private directory per member's restore
    restored[entry.pid] = (entry, entry.pid)  # CRIU restores the member under its pid: killed if it fails half-way
    # --dedup, --compress: the member's page images reassembled from the chunk store (each chunk checked)
    with phase("criu-restore"), signals.critical(), assembled(root, manifest, CRIU_DIR, entry.subdir) as criu_dir:
        images = view.enter(criu_dir / entry.subdir, lambda m: warn(progress, m))
        if opts.lazy:  # the member's page server first: CRIU's restore connects to it
            servers[entry.pid] = criu.lazy_pages(images, log_dir)
        pid = criu.restore(images, log_dir,
                           shell_job=bool(manifest.options.get("shell_job")),
                           tcp_established=bool(manifest.options.get("tcp_established")),
                           extra=_restore_options(manifest, opts),
                           started=guardian.wait_for_criu, leave_stopped=leave_stopped, lazy_pages=opts.lazy)
        restored[entry.pid] = (entry, pid)
    _unlock_closed_connections(root / CRIU_DIR / entry.subdir, manifest, opts, progress)
    return pid


def _device_restores(ready: list[tuple[MemberEntry, int, Phases]], manifest: Manifest, root: Path,
                     opts: RestoreOptions, progress: Progress, services: Services,
                     backends: list[Optional[Backend]], guardian: GuardianLike) -> None:
    """The members' device restores, in member order into backends; members holding HCCL
    communicators all at once, meeting in one rendezvous directory (opts.rendezvous, else a
    private one of this restore's own, which the guardian removes if we die)."""
    count = len(manifest.members)
    if not any(e.device.resources.get("hccl communicators", 0) > 0 for e, _, _ in ready):
        for entry, pid, member_phase in ready:
            with _naming(entry.pid, manifest.members.index(entry), count):
                _device_restore(pid, entry, manifest, root, opts, member_phase, progress, services, backends)
        return
    slots: list[list[Optional[Backend]]] = [[] for _ in ready]
    own = communicators.rendezvous(opts.rendezvous is None, os.stat(f"/proc/{ready[0][1]}").st_uid)
    with own as private:
        if private is not None:
            guardian.remove_after(private)
        meet = opts.rendezvous or private

        def one(i: int) -> None:
            entry, pid, member_phase = ready[i]
            with _naming(entry.pid, manifest.members.index(entry), count):
                _device_restore(pid, entry, manifest, root, opts, member_phase, progress, services, slots[i], meet)

        failed = at_once(range(len(ready)), one)()
    for slot in slots:
        backends.extend(slot)
    raise_first(range(len(ready)), failed)


def _device_restore(pid: int, entry: MemberEntry, manifest: Manifest, root: Path, opts: RestoreOptions,
                    phase: Phases, progress: Progress, services: Services,
                    backends: list[Optional[Backend]],
                    meet: Optional[Path] = None) -> Optional[Backend]:
    """The member's device data back on its device; it stays LOCKED until the set's unlock.
    meet: the set's rendezvous directory for HCCL ranks (communicators.py)."""
    if entry.device.backend == BackendName.NONE:
        backends.append(None)
        return None
    backend = services.restore_backend(pid, entry.device, opts.device_map)
    backends.append(backend)
    backend.adopt_lease(RESTORE_LEASE_S)  # renewed until the unlock, while the other members restore
    if backend.method in (DataPath.IN_PROCESS, DataPath.DIRECT) and backend.state() == State.RUNNING:
        warn(progress, f"process {pid}'s agent finished the device restore by itself (npusnap was stopped)")
        backends[-1] = None
        backend.release()
        return None
    with phase("device-restore") as t, contextlib.ExitStack() as views:
        hand_daemon(backend, entry.device, opts)
        communicators.hand(backend, meet)
        files: list[FileEntry] = [f for f in entry.files(manifest) if f.path.startswith(f"{DEVICE_DIR}/")]
        if manifest.parent is not None:  # incremental: the member's images in every link up the chain
            _member_chain(backend, root, manifest, entry, views)
        if opts.lazy:
            use_lazy(backend)
        device_dir = views.enter_context(assembled(root, manifest, DEVICE_DIR, entry.subdir))  # --compress
        backend.restore(device_dir / entry.subdir, files)
        t.bytes = entry.device.bytes
    return backend



def _member_chain(backend: Backend, root: Path, manifest: Manifest, entry: MemberEntry,
                  views: contextlib.ExitStack) -> None:
    from ..backends.direct import DirectBackend
    from ..image.chain import ancestors, device_views

    if not isinstance(backend, DirectBackend):
        raise WrongState(f"{root} is incremental: its device images need the direct data path to restore")
    backend.use_chain([v / entry.subdir for v in device_views(views, ancestors(root, manifest))])
