"""The checkpoint and restore pipelines, as a library (the CLI and, later, a
multi-node coordinator call these per node).

checkpoint:  LOCK -> DEVICE BACKUP -> CRIU DUMP (tree left stopped) -> seal + commit
             -> kill (default) | resume + DEVICE RESTORE + UNLOCK (--leave-running)
restore:     verify -> CRIU RESTORE -> DEVICE RESTORE -> UNLOCK

Every phase registers its undo before the next one starts; any failure,
timeout or Ctrl-C runs the undos in reverse, so the workload ends running and
unlocked. The process is killed only after the checkpoint is committed: a
checkpoint that failed never costs the job.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from . import __version__, backends, devicecheck, netlock, signing
from .criu import Criu, DumpOptions, become_subreaper, dumped_tree, find_criu
from .criuopts import CriuOptions
from .errors import CriuFailed, ImageInvalid, Interrupted, NpusnapError, UnsupportedTarget, WrongState
from .guardian import Guardian
from .image import (
    CRIU_DIR,
    DEVICE_DIR,
    LOG_DIR,
    DeviceState,
    FileEntry,
    Manifest,
    PhaseTiming,
    ProcessEntry,
    Staging,
    Writeback,
    load_manifest,
    restore_log_dir,
    verify,
)
from .imagesview import ImagesView
from .target import Target, open_target, proc_stat, process_exists, process_tree, wait_gone

Report = Callable[[str, str], None]  # (event, message): "phase" | "warn" | "info"
RESTORE_LEASE_S = 10.0  # the lease a restore keeps renewing on the restored lock until its unlock


def _quiet(event: str, message: str) -> None:
    pass


@dataclass
class CheckpointOptions:
    directory: Path
    leave_running: bool = False
    shell_job: bool = False
    tcp_established: bool = False
    device: str = "auto"
    lock_timeout: float = 60.0
    criu_timeout: Optional[float] = None
    replace: bool = False
    criu_path: Optional[str] = None
    lease: float = 10.0  # the agent unlocks by itself after this much run time without us
    data_path: str = "auto"  # device memory: auto | direct (daemon streams it to DIR/device) | in-process
    criu: CriuOptions = field(default_factory=CriuOptions)  # link-remap, ghost-limit, network lock, ...


@dataclass
class RestoreOptions:
    directory: Path
    criu_path: Optional[str] = None
    verify: bool = True
    criu_only: bool = False  # runbook: leave DEVICE RESTORE and UNLOCK to their own commands
    device_map: Optional[dict[str, str]] = None  # cuda: old GPU UUID -> new
    criu: CriuOptions = field(default_factory=CriuOptions)  # restore-side additions: tcp_close, external, inherit_fd
    require_signature: bool = False  # refuse a checkpoint not signed by one of trusted_keys
    trusted_keys: list[Path] = field(default_factory=list)  # Ed25519 public keys (PEM files)


@dataclass
class RestoreResult:
    pid: int
    manifest: Manifest
    phases: list[PhaseTiming] = field(default_factory=list)


class Phases:
    """Times each phase and tells the reporter when one starts."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.timings: list[PhaseTiming] = []

    @contextlib.contextmanager
    def __call__(self, name: str, nbytes: int = 0) -> Iterator[PhaseTiming]:
        _test_pause(f"before:{name}")
        self.report("phase", name)
        t = PhaseTiming(name, 0.0, nbytes)
        start = time.monotonic()
        yield t
        t.seconds = round(time.monotonic() - start, 6)
        self.timings.append(t)
        _test_pause(f"after:{name}")


def _test_pause(point: str, until: Callable[[], bool] = lambda: False) -> None:
    """Fault-injection hook for tests: NPUSNAP_TEST_PAUSE=before:PHASE|after:PHASE|commit makes
    the pipeline announce the point on stderr and wait there (up to 60 s, or
    NPUSNAP_TEST_PAUSE_S) for a signal; where signals are held, until() ends the wait."""
    if os.environ.get("NPUSNAP_TEST_PAUSE") != point:
        return
    sys.stderr.write(f"npusnap: test pause {point}\n")
    sys.stderr.flush()
    deadline = time.monotonic() + float(os.environ.get("NPUSNAP_TEST_PAUSE_S") or 60)
    while time.monotonic() < deadline and not until():
        time.sleep(0.05)


class Signals:
    """Turns SIGINT/SIGTERM into Interrupted, except inside critical sections
    (a CRIU dump in flight), where the signal is held until the section ends.
    Once rollback starts, further signals are ignored so the undos complete.

    The commit is one point (commit_point): a signal held across it, or arriving
    after it, never undoes committed work; the pipeline finishes and reports what
    happened. Once settled the handlers stay ignoring signals (to the process's
    exit), so nothing after the commit can report "rolled back"."""

    def __init__(self) -> None:
        self.pending = False
        self.depth = 0
        self.rolling_back = False
        self.settled = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.rolling_back or self.settled or self.depth:
            self.pending = True
            return
        raise Interrupted()

    def __enter__(self) -> "Signals":
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.settled:
            return  # our handler, settled, keeps ignoring: the outcome is decided
        for s, h in self._old.items():
            signal.signal(s, h)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.pending and not self.depth and not self.settled:
            raise Interrupted()

    @contextlib.contextmanager
    def commit_point(self) -> Iterator[None]:
        """Signals wait while the body runs; once it returned, the outcome is settled."""
        self.depth += 1
        try:
            yield
            self.settled = True
        finally:
            self.depth -= 1


def _resident_bytes(pids: list[int]) -> int:
    """What CRIU will write, about: the tree's resident memory (for progress only)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            total += int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) << 10
    return total


def _resume(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _resume_tree(root: int, pids: list[int]) -> None:
    """Resume what CRIU left stopped: the dumped tree, and any descendant of the root."""
    from .recovery import resume_tree

    _resume(pids)
    resume_tree(root)


def _run_on(images_dir: Path, extra: CriuOptions, root: int, pids: list[int], report: Report) -> None:
    """Resume a dumped tree that runs on: first undo CRIU's network lock, which it keeps
    for a tree it leaves stopped, or the tree's TCP connections are dead."""
    try:
        netlock.release(images_dir, extra.network_lock, pids, warn=lambda m: report("warn", m))
    except Exception as e:  # never keep the tree stopped over this
        report("warn", f"could not undo CRIU's network lock: {e}")
    _resume_tree(root, pids)


def _restore_options(manifest: Manifest, opts: RestoreOptions) -> CriuOptions:
    """What the dump used (the manifest's options), plus restore's own additions."""
    return CriuOptions.from_manifest(manifest.options).for_restore(opts.criu)


def _kill(pids: list[int]) -> None:
    """SIGKILL the tree and wait (bounded) until it is dead, so a restore may follow at once."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(pids, timeout=10, zombies_count=False)


def _kill_tree(root: int, pids: list[int]) -> None:
    _kill(list(dict.fromkeys([*pids, *(p.pid for p in process_tree(root))])))


def _parent(pid: int) -> int:
    fields = proc_stat(pid)
    return int(fields[2]) if fields else 0


def _refuse_device_children(target: Target) -> None:
    """Only the root's device state is locked and backed up: a descendant holding device
    state of its own would be dumped with a live driver connection (or lose its device
    memory). Refused before anything is locked."""
    for p in target.tree()[1:]:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            continue  # gone already, or not ours to read: CRIU says so if it matters
        if "libascendcl" in maps:
            raise UnsupportedTarget(
                f"process {p.pid} ({p.comm}), a descendant of {target.pid}, holds device state of its own; "
                f"npusnap checkpoints the device state of the root process only",
                "checkpoint a tree whose device user is its root (e.g. that process on its own)")


def _dumped_entries(images_dir: Path, before: list[ProcessEntry]) -> list[ProcessEntry]:
    """The manifest's process list from CRIU's pstree.img (what the dump holds), with
    the root's real parent and each name from before the freeze or /proc."""
    known = {p.pid: p for p in before}
    out: list[ProcessEntry] = []
    for pid, ppid, threads in dumped_tree(images_dir):
        if pid in known:
            comm = known[pid].comm
            if not out:
                ppid = known[pid].ppid  # pstree gives the root a ppid of 0 (outside the dump)
        else:
            fields = proc_stat(pid)
            comm = fields[0] if fields else ""
        out.append(ProcessEntry(pid=pid, ppid=ppid, comm=comm, threads=threads))
    return out


def checkpoint(pid: int, opts: CheckpointOptions, report: Report = _quiet,
               device_phases: bool = True) -> Manifest:
    """Checkpoint pid into opts.directory. Raises NpusnapError after rolling back.

    With device_phases=False this is the runbook's DUMP phase alone: the device
    must already be backed up (`npusnap lock` + `npusnap backup`), and with
    leave_running the process resumes still backed up, for the runbook to restore.
    """
    target = open_target(pid)
    criu = Criu(find_criu(opts.criu_path))
    extra = opts.criu
    if opts.tcp_established or extra.network_lock:  # the lock matters only to dumped connections
        extra = replace(extra, network_lock=netlock.choose(extra.network_lock, criu.binary.path))
    # The runbook's DUMP phase follows `npusnap backup`, which stages device memory in the process.
    backend = backends.select(pid, opts.device, target.maps(), opts.data_path if device_phases else "in-process")
    state = backend.state()
    expected = "RUNNING" if device_phases or backend.name == "none" else "BACKED_UP"
    if state != expected:
        if expected == "BACKED_UP":
            raise WrongState(f"process {pid} is {state}: its device state is not backed up yet",
                             f"run `npusnap lock {pid}` and `npusnap backup {pid}` first")
        raise WrongState(f"process {pid} is {state}, not RUNNING",
                         f"finish or undo the manual phases first (`npusnap recover {pid}`)")
    _refuse_device_children(target)
    if not device_phases:
        backend = _Already(backend)
    direct = backend.method == backends.DirectBackend.method
    staging = Staging(opts.directory, opts.replace)
    guardian = Guardian(staging.path, pid)  # from now on, our death is cleaned up after
    phase = Phases(report)
    frozen: list[int] = []  # the tree CRIU froze, from its pstree.img once the dump returned
    device_back = [not direct]  # the direct path's staged device data is the only copy until this

    def undo(what: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as e:  # keep undoing: one failed undo must not strand the rest
                report("warn", f"rollback: {what} failed: {e}")
        return run

    def device_rollback() -> None:
        backend.back_to_running()
        device_back[0] = True

    def discard() -> None:
        try:
            staged = not staging.committed and any(staging.device_dir.iterdir())
        except OSError:
            staged = False
        if device_back[0] or not staged:
            staging.discard()
            return
        # The workload still needs this data: never delete it (no manifest: it does not look valid).
        report("warn", f"the device data of process {pid} stays in {staging.device_dir}: "
                       f"`npusnap recover {pid} --device-images {staging.device_dir}` puts it back")

    try:
        with Signals() as signals:
            with contextlib.ExitStack() as undos:
                undos.callback(undo("cleanup", discard))
                try:
                    # Registered before the lock: a signal may land the instant a phase
                    # returns. It undoes whatever part of lock/backup really happened.
                    undos.callback(undo("device rollback", device_rollback))
                    with phase("lock"):
                        backend.lock(opts.lock_timeout, lease=opts.lease)
                    if direct:
                        guardian.recover_from(staging.device_dir)  # if we die, it brings the device data back
                        report("watch", f"{staging.device_dir}\t{backend.describe().bytes}")
                    backend.fence()  # a CLI stopped past its lease stops here, before each step
                    with phase("backup") as t:
                        device_files = backend.backup(staging.device_dir)
                        device = backend.describe()
                        t.bytes = device.bytes
                    backend.fence()
                    before = target.tree()
                    guardian.watch([p.pid for p in before])  # CRIU leaves them stopped: resumed if we die
                    with phase("dump") as dump_timing, signals.critical(), Writeback(staging.criu_dir):
                        report("watch", f"{staging.criu_dir}\t{_resident_bytes([p.pid for p in before])}")
                        undos.callback(undo("resume", lambda: _run_on(staging.criu_dir, extra, pid, frozen, report)))
                        criu.dump(DumpOptions(
                            pid=pid, images_dir=staging.criu_dir, log_dir=staging.log_dir,
                            leave_stopped=True, shell_job=opts.shell_job,
                            tcp_established=opts.tcp_established, timeout=opts.criu_timeout, extra=extra,
                        ))
                        tree = _dumped_entries(staging.criu_dir, before)
                        frozen[:] = [p.pid for p in tree]
                        guardian.watch(frozen)
                    with phase("seal") as t:
                        files = staging.seal(known=device_files)
                        t.bytes = dump_timing.bytes = sum(f.size for f in files if f.path.startswith(CRIU_DIR))
                    manifest = Manifest(
                        pid=pid,
                        created=datetime.now(timezone.utc).isoformat(timespec="microseconds"),  # prune orders by it
                        host=socket.gethostname(),
                        kernel=platform.release(),
                        npusnap_version=__version__,
                        criu_version=criu.binary.version_str,
                        command=target.command,
                        options={"shell_job": opts.shell_job, "tcp_established": opts.tcp_established,
                                 "leave_running": opts.leave_running, **extra.recorded()},
                        processes=tree,
                        device=device,
                        phases=phase.timings,
                        files=files,
                    )
                    with signals.commit_point():
                        staging.commit(manifest)
                        _test_pause("commit", until=lambda: signals.pending)
                except BaseException:
                    signals.rolling_back = True
                    raise
                undos.pop_all()

            # Committed: signals no longer interrupt, and a failure from here on costs
            # nothing but this process's own state.
            if signals.pending:
                report("warn", "interrupt received after the checkpoint was committed: finishing it")
            if not opts.leave_running:
                _kill(frozen)
                return manifest
            _run_on(staging.final / CRIU_DIR, extra, pid, frozen, report)
            _device_back_after_commit(backend, staging.final / DEVICE_DIR, device_files)
            return manifest
    finally:
        backend.release()
        guardian.release()


def _device_back_after_commit(backend: backends.NoDevice, device_dir: Path, files: list[FileEntry]) -> None:
    """--leave-running after the commit: device restore (from the committed directory: the
    staging path has moved) and unlock. If we were stopped past the lease, the agent may have
    done part of it already: only what is left is done."""
    if not isinstance(backend, backends.AgentBackend):
        backend.restore(device_dir, files)
        backend.unlock()
        return
    for attempt in (1, 2):
        state = backend.state()
        try:
            if state == "BACKED_UP":
                backend.restore(device_dir, files)
            if state != "RUNNING":
                backend.unlock()
            return
        except WrongState:
            if attempt == 2:  # the agent moved under us once (lease expiry); not twice
                raise


class _Already(backends.NoDevice):
    """A backend whose lock and backup were done by earlier runbook phases: its
    phases here are no-ops, but it still describes the device state."""

    def __init__(self, inner: backends.NoDevice) -> None:
        self.inner = inner
        self.name = inner.name

    def describe(self) -> DeviceState:
        return self.inner.describe()


def _pids_in_use(manifest: Manifest) -> list[int]:
    # A zombie still holds its pid; give its parent a moment to reap it.
    return wait_gone([p.pid for p in manifest.processes], timeout=2, zombies_count=True)


def restore(opts: RestoreOptions, report: Report = _quiet) -> RestoreResult:
    """Restore the checkpoint in opts.directory; the restored root becomes our child.

    Between CRIU's restore and the unlock the restored tree is guarded: an interrupt
    or a failure kills it (the checkpoint stays valid and restorable), and so does the
    guardian if we die. The unlock is the commit point: after it, the restore stands."""
    root = opts.directory.absolute()
    phase = Phases(report)
    with phase("verify"):
        signing.check(root, opts.trusted_keys, opts.require_signature)  # even with --no-verify
        manifest = load_manifest(root)
        if opts.verify:
            # Direct device images are checksummed again as the daemon reads them in: sizes suffice here.
            direct = manifest.device.method == backends.DirectBackend.method
            verify(root, manifest, shallow=(DEVICE_DIR,) if direct else ())
    devicecheck.fits(manifest.device)
    taken = _pids_in_use(manifest)
    if taken:
        pid = taken[0]
        if process_exists(pid, zombies_count=False):
            raise CriuFailed(f"pid {pid} from the checkpoint is in use by a running process",
                             "stop it first (a checkpoint restores its processes with their original pids)")
        parent = _parent(pid)
        raise CriuFailed(f"pid {pid} from the checkpoint is held by a zombie that process {parent} has not reaped",
                         f"process {parent} must wait() for its child, or exit")
    criu = Criu(find_criu(opts.criu_path))
    try:  # never DIR/logs/restore.log itself: a link planted there would be followed by CRIU
        log_dir = restore_log_dir(root)
    except (OSError, ImageInvalid):
        log_dir = Path(tempfile.mkdtemp(prefix="npusnap-restore-logs-"))
        report("info", f"cannot write logs in {root / LOG_DIR}; CRIU logs go to {log_dir}")
    become_subreaper()  # the restored root is adopted by us once `criu swrk` exits: we can wait for it
    pids = [p.pid for p in manifest.processes]
    guardian = Guardian(None, manifest.pid)
    try:
        with Signals() as signals, ImagesView() as view:
            try:
                guardian.kill_if_dead(pids)
                with phase("criu-restore"), signals.critical():
                    pid = criu.restore(view.enter(root / CRIU_DIR, report), log_dir,
                                       shell_job=bool(manifest.options.get("shell_job")),
                                       tcp_established=bool(manifest.options.get("tcp_established")),
                                       extra=_restore_options(manifest, opts),
                                       started=guardian.wait_for_criu)
                _unlock_closed_connections(root / CRIU_DIR, manifest, opts, report)
                if manifest.device.backend != "none" and not opts.criu_only:
                    _finish_device(pid, manifest, root, opts, phase, signals, report)
                else:
                    signals.settled = True
            except BaseException:
                # The image stays valid on disk; a half-restored process must not run on.
                signals.rolling_back = True
                _kill_tree(manifest.pid, pids)
                raise
    finally:
        guardian.release()
    return RestoreResult(pid, manifest, phase.timings)


def _unlock_closed_connections(images_dir: Path, manifest: Manifest, opts: RestoreOptions, report: Report) -> None:
    """CRIU restores a dump's established connections closed under --tcp-close and then leaves
    the dump's network lock on them (it unlocks only connections it repaired): rules that would
    drop a later connection on the same addresses and ports. Taken away here."""
    extra = _restore_options(manifest, opts)
    if not (extra.tcp_close and manifest.options.get("tcp_established")):
        return
    try:
        netlock.drop_lock(images_dir, extra.network_lock, warn=lambda m: report("warn", m))
    except Exception as e:  # the restore stands; the rules are the machine's to clean then
        report("warn", f"could not undo CRIU's network lock of the closed connections: {e}")


def _finish_device(pid: int, manifest: Manifest, root: Path, opts: RestoreOptions, phase: Phases,
                   signals: Signals, report: Report) -> None:
    """DEVICE RESTORE and UNLOCK of a restored tree; the unlock is the commit point."""
    backend = backends.for_restore(pid, manifest.device, opts.device_map)
    try:
        # The restored agent carries the dump's lease: renewed from now on. If it ran out before
        # we got here (we were stopped), the agent put the device back itself (in-process).
        backend.adopt_lease(RESTORE_LEASE_S)
        if isinstance(backend, backends.AgentBackend) and backend.state() == "RUNNING":
            report("warn", f"process {pid}'s agent finished the device restore by itself (npusnap was stopped)")
            signals.settled = True
            return
        with phase("device-restore") as t:
            images = [f for f in manifest.files if f.path.startswith(f"{DEVICE_DIR}/")]
            backend.restore(root / DEVICE_DIR, images)
            t.bytes = manifest.device.bytes
        with signals.commit_point(), phase("unlock"):
            backend.unlock()
    finally:
        backend.release()


def wait_exit_code(pid: int) -> int:
    """Wait for a restored process (our child through the subreaper) and return its exit code.
    An interrupt stops the waiting only: the restore stands and the process runs on."""
    def stop_waiting(signum: int, frame: Any) -> None:
        raise Interrupted(f"stopped waiting; restored process {pid} runs on")

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop_waiting)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            raise NpusnapError(f"restored process {pid} is not our child; cannot wait for it",
                               "use --detach and watch the process another way") from None
        except InterruptedError:
            continue
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
