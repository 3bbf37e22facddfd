"""The restore pipeline:  verify -> CRIU RESTORE (page images verified meanwhile) -> DEVICE RESTORE -> UNLOCK.

Between CRIU's restore and the unlock the restored tree is guarded: an interrupt or a failure
kills it (the checkpoint stays valid and restorable), and so does the guardian if we die. The
unlock is the commit point: after it, the restore stands."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..backends import Backend, BackendName, DataPath, State, unlock_unless_running
from ..criuopts import CriuOptions
from ..errors import CriuFailed, EnvironmentProblem, ImageInvalid, Interrupted, NpusnapError, WrongState
from ..image import signing
from ..image.chain import ancestors, device_views, verify_chain
from ..image.checksums import BulkVerifier, page_entries
from ..image.format import (
    CRIU_DIR,
    DEVICE_DIR,
    LOG_DIR,
    DeviceState,
    Manifest,
    PhaseTiming,
    check_entry,
    load_manifest,
    packed_entries,
    restore_log_dir,
)
from ..image.packed import assembled, verify
from ..platform.criuimages import stopped_at_dump
from ..platform.procfs import process_exists
from . import communicators, processes
from .progress import Phases, Progress, info, quiet, warn
from .services import REAL, Services
from .signals import Signals

if TYPE_CHECKING:
    from ..backends.direct import ImportAhead
    from ..platform.criu import LazyPages
    from .lazy import LazyRestore
    from .services import CriuDriver

RESTORE_LEASE_S = 10.0  # the lease a restore keeps renewing on the restored lock until its unlock


@dataclass
class RestoreOptions:
    """What `npusnap restore` was asked to do."""

    directory: Path
    criu_path: Optional[str] = None
    verify: bool = True
    criu_only: bool = False  # runbook: leave DEVICE RESTORE and UNLOCK to their own commands
    device_map: Optional[dict[str, str]] = None  # cuda: old GPU UUID -> new
    criu: CriuOptions = field(default_factory=CriuOptions)  # restore-side additions and choices (criu_flags.py)
    require_signature: bool = False  # refuse a checkpoint not signed by one of trusted_keys
    trusted_keys: list[Path] = field(default_factory=list)  # Ed25519 public keys (PEM files)
    rendezvous: Optional[Path] = None  # where HCCL ranks restored separately meet (communicators.py)
    # sim: the npusim daemon the restored runtimes reconnect to (a job worker's own node's), whatever
    # socket they started with; None: each its old one (the manifest's endpoint)
    daemon_socket: Optional[str] = None
    # --lazy (lazy.py): the workload runs before its memory is back; RestoreResult.lazy brings it in
    lazy: bool = False


@dataclass
class RestoreResult:
    """A restored process: its pid, the manifest it came from, and the phases' timings."""

    pid: int
    manifest: Manifest
    phases: list[PhaseTiming] = field(default_factory=list)
    lazy: Optional[LazyRestore] = None  # --lazy: the caller must finish() it (or kill() it)


def restore(opts: RestoreOptions, progress: Progress = quiet, services: Services = REAL) -> RestoreResult:
    """Restore the checkpoint in opts.directory; the restored root becomes our child."""
    root = opts.directory.absolute()
    phase = Phases(progress)
    manifest, pages = _verified(root, opts, phase)
    if opts.lazy:
        refuse_lazy(root, manifest, opts)
    services.device_fits(on_daemon(manifest.device, opts))
    _refuse_pids_in_use(manifest)
    criu = services.criu(opts.criu_path)
    if opts.lazy:
        lazy_supported(criu)
    try:  # never DIR/logs/restore.log itself: a link planted there would be followed by CRIU
        log_dir = restore_log_dir(root)
    except (OSError, ImageInvalid):
        import tempfile

        log_dir = Path(tempfile.mkdtemp(prefix="npusnap-restore-logs-"))
        info(progress, f"cannot write logs in {root / LOG_DIR}; CRIU logs go to {log_dir}")
    services.become_subreaper()  # the restored root is adopted by us once `criu swrk` exits: we can wait for it
    pids = [p.pid for p in manifest.processes]
    restored = [manifest.pid]  # the root to kill on failure: CRIU's answer once it has one
    guardian = services.guardian(None, manifest.pid)
    lazy_pages = None
    ahead = _import_ahead(root, manifest, opts)
    try:
        with Signals() as signals, services.images_view() as view, assembled(root, manifest) as images:
            try:
                guardian.kill_if_dead(pids)
                with phase("criu-restore") as t, signals.critical():
                    images_dir = view.enter(images, lambda m: warn(progress, m))
                    if opts.lazy:  # its page server first: CRIU's restore connects to it
                        lazy_pages = criu.lazy_pages(images_dir, log_dir)
                    started = time.monotonic()
                    try:
                        restored[0] = criu.restore(images_dir,
                                                   log_dir, shell_job=bool(manifest.options.get("shell_job")),
                                                   tcp_established=bool(manifest.options.get("tcp_established")),
                                                   extra=_restore_options(manifest, opts),
                                                   started=_criu_started(guardian, ahead),
                                                   leave_stopped=pages is not None,
                                                   lazy_pages=opts.lazy)
                    except NpusnapError:
                        if pages is not None:
                            pages.result()  # a corrupt page image explains CRIU's failure best
                        raise
                    t.add_parts({"criu": (time.monotonic() - started, 0)})
                    if pages is not None:  # the tree is stopped, as CRIU left it: it runs only on good pages
                        waited = time.monotonic()
                        pages.result()
                        t.add_parts({"page-checksums-wait": (time.monotonic() - waited, pages.bytes)})
                        processes.resume(restored[0], pids)
                    if ahead is not None:
                        t.add_parts(ahead.parts())
                _unlock_closed_connections(root / CRIU_DIR, manifest, opts, progress)
                if manifest.device.backend != BackendName.NONE and not opts.criu_only:
                    _finish_device(restored[0], manifest, root, opts, phase, signals, progress, services,
                                   opts.rendezvous, ahead=ahead is not None and ahead.done)
                else:
                    signals.settled = True
            except BaseException:
                # The image stays valid on disk; a half-restored process must not run on.
                signals.rolling_back = True
                processes.kill_tree(restored[0], list(dict.fromkeys([restored[0], *pids])))
                if lazy_pages is not None:
                    lazy_pages.kill()
                raise
    finally:
        if ahead is not None:
            ahead.result()  # joined on every path; after a failure the daemon frees what it kept once the pid is gone
        guardian.release()
    lazy = None
    if opts.lazy:
        lazy = lazy_restore(restored[0], pids, lazy_pages, manifest.device, opts,
                            sum(f.size for f in page_entries(manifest)))
    return RestoreResult(restored[0], manifest, phase.timings, lazy)


def _verified(root: Path, opts: RestoreOptions, phase: Phases) -> tuple[Manifest, Optional[BulkVerifier]]:
    """The manifest, every image checked but CRIU's page images (the bulk of the bytes), whose
    checksums a BulkVerifier checks while CRIU reads them (returned, started; None when all was
    checked here). Everything CRIU parses, as root, is checked before it sees it; the pages are
    only memory contents poured into the restored tree, which CRIU then leaves stopped, to be
    resumed only once they all match (and killed otherwise): never run on bad data."""
    with phase("verify"):
        signing.check(root, opts.trusted_keys, opts.require_signature)  # even with --no-verify
        manifest = load_manifest(root)
        if not opts.verify:
            return manifest, None
        # Direct device images are checksummed again as the daemon reads them in: sizes suffice here.
        direct = manifest.device.method == DataPath.DIRECT
        # --lazy too: the page server may pour pages in before they are checked, but the tree stays
        # stopped until all are (the first step waits for the slower of the check and the restore,
        # not for both); a tree that cannot wait stopped has them all checked here first.
        wait_stopped = _can_wait_stopped(root, manifest)
        pages = [e for e in page_entries(manifest) if not e.chunks] if wait_stopped else []
        # Chunks in the store are checked as they are reassembled, before CRIU runs (packed.assembled).
        later = {e.path for e in pages} | {e.path for e in packed_entries(manifest)}
        verify(root, manifest, shallow=(DEVICE_DIR,) if direct else (), later=later, deep=False)
        verify_chain(root, manifest, deep=False)  # an incremental's ancestors; the daemon checks each chunk it takes
    return manifest, BulkVerifier(root, pages, check_entry, read_ahead=not opts.lazy).start() if pages else None


def _import_ahead(root: Path, manifest: Manifest, opts: RestoreOptions) -> Optional["ImportAhead"]:
    """The device memory read in while CRIU restores the tree (backends/direct.ImportAhead): for one
    process's plain direct-path images, from the daemon the checkpoint (or --daemon-socket) names."""
    device = on_daemon(manifest.device, opts)
    images = [f for f in manifest.files if f.path.startswith(f"{DEVICE_DIR}/")]
    if (device.backend != BackendName.SIM or device.method != DataPath.DIRECT or not device.endpoint
            or opts.lazy or opts.criu_only or opts.device_map or manifest.is_set or manifest.parent is not None
            or not images or any(f.chunks for f in images)):
        return None  # a lazy, incremental or compressed image, or a set: imported after CRIU, as it needs
    from ..backends.direct import ImportAhead

    return ImportAhead(manifest.pid, device.endpoint, root / DEVICE_DIR, images)


def _criu_started(guardian: Any, ahead: Optional["ImportAhead"]) -> Callable[[int], None]:
    def started(pid: int) -> None:  # CRIU runs as pid
        guardian.wait_for_criu(pid)
        if ahead is not None:
            ahead.criu_started(pid)

    return started


def _can_wait_stopped(root: Path, manifest: Manifest) -> bool:
    """Whether the restored tree may be left stopped by CRIU and resumed by us: not a shell job
    (stopped and detached, CRIU warns, it gets SIGHUP), and no process that was stopped when it was
    dumped (a SIGCONT would wake it). Read from images verified right after, before CRIU runs."""
    if manifest.options.get("shell_job"):
        return False
    trees = ([(root / CRIU_DIR / e.subdir, e.processes) for e in manifest.members] if manifest.is_set
             else [(root / CRIU_DIR, manifest.processes)])
    try:
        return not any(stopped_at_dump(images, [p.pid for p in procs]) for images, procs in trees)
    except (OSError, ValueError):
        return False  # verify() says what is wrong with them


def refuse_lazy(root: Path, manifest: Manifest, opts: RestoreOptions) -> None:
    """--lazy needs what brings the memory in later: the direct data path for device memory (every
    member's, for a set)."""
    if opts.criu_only:
        raise WrongState("--lazy and --criu-only do not go together",
                         "a lazy restore brings the device memory in itself: drop one of them")
    for device in [e.device for e in manifest.members] if manifest.is_set else [manifest.device]:
        if device.backend != BackendName.NONE and device.method != DataPath.DIRECT:
            raise WrongState(f"{root}'s device memory was saved by the {device.method} data path; "
                             "--lazy needs the direct one (npusim's daemon brings chunks in on first touch)",
                             "restore it without --lazy, or checkpoint with the direct data path")


def lazy_supported(criu: "CriuDriver") -> None:
    if not criu.features().get("lazy_pages"):  # userfaultfd, as CRIU probes it
        raise EnvironmentProblem("this kernel or CRIU cannot restore lazily (CRIU's lazy_pages feature check "
                                 "failed: userfaultfd missing or not allowed)",
                                 "restore without --lazy; `criu check --feature uffd-noncoop` says more")


def lazy_restore(pid: int, pids: list[int], pages: Optional["LazyPages"], device: DeviceState,
                 opts: RestoreOptions, page_bytes: int) -> LazyRestore:
    """What brings a lazily restored tree's memory in (host pages, device chunks) until it all is."""
    from .lazy import LazyRestore  # here: only --lazy needs it, and every restore imports this module

    on = on_daemon(device, opts)
    return LazyRestore(pid, pids, pages, on.endpoint if on.backend == BackendName.SIM else None,
                       device.bytes + page_bytes)


def _refuse_pids_in_use(manifest: Manifest) -> None:
    taken = processes.pids_in_use([p.pid for p in manifest.processes])
    if not taken:
        return
    pid = taken[0]
    if process_exists(pid, zombies_count=False):
        raise CriuFailed(f"pid {pid} from the checkpoint is in use by a running process",
                         "stop it first (a checkpoint restores its processes with their original pids)")
    parent = processes.parent(pid)
    raise CriuFailed(f"pid {pid} from the checkpoint is held by a zombie that process {parent} has not reaped",
                     f"process {parent} must wait() for its child, or exit")


def _restore_options(manifest: Manifest, opts: RestoreOptions) -> CriuOptions:
    """What the dump used (the manifest's options), plus restore's own additions."""
    return CriuOptions.from_manifest(manifest.options).for_restore(opts.criu)


def _unlock_closed_connections(images_dir: Path, manifest: Manifest, opts: RestoreOptions,
                               progress: Progress) -> None:
    """CRIU restores a dump's established connections closed under --tcp-close and then leaves
    the dump's network lock on them (it unlocks only connections it repaired): rules that would
    drop a later connection on the same addresses and ports. Taken away here."""
    extra = _restore_options(manifest, opts)
    if not (extra.tcp_close and manifest.options.get("tcp_established")):
        return
    from .. import netlock

    try:
        netlock.drop_lock(images_dir, extra.network_lock, warn=lambda m: warn(progress, m))
    except Exception as e:  # the restore stands; the rules are the machine's to clean then
        warn(progress, f"could not undo CRIU's network lock of the closed connections: {e}")


def holds_communicators(manifest: Manifest) -> bool:
    """The checkpointed runtime held HCCL communicators: its restore re-forms them with its peers."""
    return manifest.device.resources.get("hccl communicators", 0) > 0


def _finish_device(pid: int, manifest: Manifest, root: Path, opts: RestoreOptions, phase: Phases,
                   signals: Signals, progress: Progress, services: Services,
                   meet: Optional[Path] = None, ahead: bool = False) -> None:
    """DEVICE RESTORE and UNLOCK of a restored tree; the unlock is the commit point. meet: the
    set's rendezvous directory for HCCL ranks (communicators.py); a lone process gets its own.
    ahead: an ImportAhead kept the device memory for the process in its daemon."""
    if meet is None and holds_communicators(manifest):
        with communicators.rendezvous(True, os.stat(f"/proc/{pid}").st_uid) as own:
            _finish_device(pid, manifest, root, opts, phase, signals, progress, services, own, ahead)
        return
    backend = services.restore_backend(pid, manifest.device, opts.device_map)
    if ahead:
        from ..backends.direct import DirectBackend

        if isinstance(backend, DirectBackend):
            backend.ahead = True
    try:
        # The restored agent carries the dump's lease: renewed from now on. If it ran out before
        # we got here (we were stopped), the agent put the device back itself (in-process).
        backend.adopt_lease(RESTORE_LEASE_S)
        if backend.method in (DataPath.IN_PROCESS, DataPath.DIRECT) and backend.state() == State.RUNNING:
            warn(progress, f"process {pid}'s agent finished the device restore by itself (npusnap was stopped)")
            signals.settled = True
            return
        with phase("device-restore") as t, contextlib.ExitStack() as views:
            hand_daemon(backend, manifest.device, opts)
            communicators.hand(backend, meet)
            images = [f for f in manifest.files if f.path.startswith(f"{DEVICE_DIR}/")]
            if manifest.parent is not None:
                _use_chain(backend, root, manifest, views)
            if opts.lazy:
                use_lazy(backend)
            # compressed images (--compress) reassembled first, each chunk checked
            backend.restore(views.enter_context(assembled(root, manifest, DEVICE_DIR)), images)
            t.bytes = manifest.device.bytes
            t.add_parts(getattr(backend, "parts", {}))
        with signals.commit_point(), phase("unlock"):
            unlock_unless_running(backend)
    finally:
        backend.release()


def use_lazy(backend: Backend) -> None:
    from ..backends.direct import DirectBackend

    if isinstance(backend, DirectBackend):  # refuse_lazy let only the direct path through
        backend.lazy = True


def _use_chain(backend: Backend, root: Path, manifest: Manifest, views: contextlib.ExitStack) -> None:
    from ..backends.direct import DirectBackend

    if not isinstance(backend, DirectBackend):
        raise WrongState(f"{root} is incremental: its device images need the direct data path to restore")
    backend.use_chain(device_views(views, ancestors(root, manifest)))


def on_daemon(device: DeviceState, opts: RestoreOptions) -> DeviceState:
    """The checkpoint's device as it will be restored: on opts.daemon_socket when one is given."""
    if opts.daemon_socket and device.backend == BackendName.SIM:
        return dataclasses.replace(device, endpoint=opts.daemon_socket)
    return device


def hand_daemon(backend: Any, device: DeviceState, opts: RestoreOptions) -> None:
    """Before its device restore, tell a runtime which daemon to reconnect to (agent `hccl socket
    PATH`, npusimSnapShotUseDaemon): a process restored on another node must use that node's
    daemon, not the one its stale NPUSIM_SOCKET names."""
    if opts.daemon_socket and device.backend == BackendName.SIM and hasattr(backend, "use_daemon"):
        backend.use_daemon(opts.daemon_socket)


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
