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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from . import __version__, backends, devicecheck, signing
from .criu import Criu, DumpOptions, become_subreaper, find_criu
from .errors import CriuFailed, ImageInvalid, Interrupted, NpusnapError, WrongState
from .guardian import Guardian
from .image import (
    CRIU_DIR,
    DEVICE_DIR,
    LOG_DIR,
    DeviceState,
    Manifest,
    PhaseTiming,
    Staging,
    Writeback,
    load_manifest,
    restore_log_dir,
    verify,
)
from .imagesview import ImagesView
from .target import open_target, proc_stat, process_exists, wait_gone

Report = Callable[[str, str], None]  # (event, message): "phase" | "warn" | "info"


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


@dataclass
class RestoreOptions:
    directory: Path
    criu_path: Optional[str] = None
    verify: bool = True
    criu_only: bool = False  # runbook: leave DEVICE RESTORE and UNLOCK to their own commands
    device_map: Optional[dict[str, str]] = None  # cuda: old GPU UUID -> new
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


def _test_pause(point: str) -> None:
    """Fault-injection hook for tests: NPUSNAP_TEST_PAUSE=before:PHASE|after:PHASE makes
    the pipeline announce the point on stderr and wait there (up to 60 s) for a signal."""
    if os.environ.get("NPUSNAP_TEST_PAUSE") != point:
        return
    sys.stderr.write(f"npusnap: test pause {point}\n")
    sys.stderr.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)


class Signals:
    """Turns SIGINT/SIGTERM into Interrupted, except inside critical sections
    (a CRIU dump in flight), where the signal is held until the section ends.
    Once rollback starts, further signals are ignored so the undos complete."""

    def __init__(self) -> None:
        self.pending = False
        self.depth = 0
        self.rolling_back = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.rolling_back:
            return
        if self.depth:
            self.pending = True
            return
        raise Interrupted()

    def __enter__(self) -> "Signals":
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.pending and not self.depth:
            raise Interrupted()


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


def _kill(pids: list[int]) -> None:
    """SIGKILL the tree and wait (bounded) until it is dead, so a restore may follow at once."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(pids, timeout=10, zombies_count=False)


def _parent(pid: int) -> int:
    fields = proc_stat(pid)
    return int(fields[2]) if fields else 0


def checkpoint(pid: int, opts: CheckpointOptions, report: Report = _quiet,
               device_phases: bool = True) -> Manifest:
    """Checkpoint pid into opts.directory. Raises NpusnapError after rolling back.

    With device_phases=False this is the runbook's DUMP phase alone: the device
    must already be backed up (`npusnap lock` + `npusnap backup`), and with
    leave_running the process resumes still backed up, for the runbook to restore.
    """
    target = open_target(pid)
    criu = Criu(find_criu(opts.criu_path))
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
    if not device_phases:
        backend = _Already(backend)
    staging = Staging(opts.directory, opts.replace)
    guardian = Guardian(staging.path, pid)  # from now on, our death is cleaned up after
    phase = Phases(report)
    tree_pids: list[int] = []

    def undo(what: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as e:  # keep undoing: one failed undo must not strand the rest
                report("warn", f"rollback: {what} failed: {e}")
        return run

    try:
        with Signals() as signals, contextlib.ExitStack() as undos:
            undos.callback(staging.discard)
            try:
                # Registered before the lock: a signal may land the instant a phase
                # returns. It undoes whatever part of lock/backup really happened.
                undos.callback(undo("device rollback", backend.back_to_running))
                with phase("lock"):
                    backend.lock(opts.lock_timeout, lease=opts.lease)
                if backend.method == backends.DirectBackend.method:
                    guardian.recover_from(staging.device_dir)  # if we die, it brings the device data back
                    report("watch", f"{staging.device_dir}\t{backend.describe().bytes}")
                with phase("backup") as t:
                    device_files = backend.backup(staging.device_dir)
                    device = backend.describe()
                    t.bytes = device.bytes
                tree = target.tree()
                tree_pids = [p.pid for p in tree]
                guardian.watch(tree_pids)  # CRIU leaves them stopped: resumed if we die
                with phase("dump") as dump_timing, signals.critical(), Writeback(staging.criu_dir):
                    report("watch", f"{staging.criu_dir}\t{_resident_bytes(tree_pids)}")
                    undos.callback(undo("resume", lambda: _resume(tree_pids)))
                    criu.dump(DumpOptions(
                        pid=pid, images_dir=staging.criu_dir, log_dir=staging.log_dir,
                        leave_stopped=True, shell_job=opts.shell_job,
                        tcp_established=opts.tcp_established, timeout=opts.criu_timeout,
                    ))
                with phase("seal") as t:
                    files = staging.seal(known=device_files)
                    t.bytes = dump_timing.bytes = sum(f.size for f in files if f.path.startswith(CRIU_DIR))
                manifest = Manifest(
                    pid=pid,
                    created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    host=socket.gethostname(),
                    kernel=platform.release(),
                    npusnap_version=__version__,
                    criu_version=criu.binary.version_str,
                    command=target.command,
                    options={"shell_job": opts.shell_job, "tcp_established": opts.tcp_established,
                             "leave_running": opts.leave_running},
                    processes=tree,
                    device=device,
                    phases=phase.timings,
                    files=files,
                )
                with signals.critical():
                    staging.commit(manifest)
            except BaseException:
                signals.rolling_back = True
                raise
            undos.pop_all()

        # Committed: from here on a failure costs nothing but this process's own state.
        if not opts.leave_running:
            _kill(tree_pids)
            return manifest
        _resume(tree_pids)
        backend.restore(staging.final / DEVICE_DIR, device_files)
        backend.unlock()
        return manifest
    finally:
        backend.release()
        guardian.release()


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
    """Restore the checkpoint in opts.directory; the restored root becomes our child."""
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
    with Signals() as signals, ImagesView() as view:
        with phase("criu-restore"), signals.critical():
            pid = criu.restore(view.enter(root / CRIU_DIR, report), log_dir,
                               shell_job=bool(manifest.options.get("shell_job")),
                               tcp_established=bool(manifest.options.get("tcp_established")))
        if manifest.device.backend != "none" and not opts.criu_only:
            backend = backends.for_restore(pid, manifest.device, opts.device_map)
            try:
                with phase("device-restore") as t:
                    images = [f for f in manifest.files if f.path.startswith(f"{DEVICE_DIR}/")]
                    backend.restore(root / DEVICE_DIR, images)
                    t.bytes = manifest.device.bytes
                with phase("unlock"):
                    backend.unlock()
            except BaseException:
                # The image stays valid on disk; a half-restored process must not run on.
                signals.rolling_back = True
                _kill([p.pid for p in manifest.processes])
                raise
    return RestoreResult(pid, manifest, phase.timings)


def wait_exit_code(pid: int) -> int:
    """Wait for a restored process (our child through the subreaper) and return its exit code."""
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
