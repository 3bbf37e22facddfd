"""The direct backend (npusim only): the daemon streams device memory straight into DIR/device/
(zero chunks elided, checksummed while streaming) and the process keeps only metadata, so device
memory is neither staged in host RAM nor written twice. A real CANN runtime offers only the
in-process path. The file transfers themselves are platform/simimages.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from .. import testhooks
from ..errors import NpusnapError, WrongState
from ..image.format import DeviceState, FileEntry
from ..image.prefetch import Prefetch
from ..platform.agent import AgentProblem, agent_error
from ..platform.simimages import drop_snapshot, export_device, import_device, snapshot_device
from .agent import AgentBackend
from .base import BackendName, DataPath, State, unlock_unless_running

Parts = dict[str, tuple[float, int]]  # a step's (seconds, bytes), for its phase's profile (PhaseTiming.parts)


def restore_direct(client: Any, pid: int, device_dir: Path, expected: Optional[Iterable[FileEntry]],
                   socket: Optional[str] = None, chain: Sequence[Path] = (), lazy: bool = False,
                   ahead: bool = False) -> Parts:
    """`restore external` through the agent, then the import: the process ends LOCKED with its
    device memory back (the undo of `backup external`, and the restore's device phase). Returns
    the two steps' (seconds, bytes). ahead: an ImportAhead filled the memory; the restore takes it
    back and the import reads only if that was not all of it."""
    expected = None if expected is None else list(expected)
    names = [] if ahead else [Path(f.path).name for f in expected or ()]
    started = time.monotonic()
    try:
        # The disk would idle while the runtime re-creates its allocations: read ahead meanwhile.
        with Prefetch(device_dir, names):
            client.restore(external=True)
    except AgentProblem as e:
        raise agent_error(e, f"device restore (external) of process {pid}") from e
    recreated = time.monotonic() - started
    imported = import_device(pid, device_dir, expected, socket, chain, lazy, if_due=ahead)
    return {"restore-external": (recreated, 0), "import": (imported.seconds, imported.file_bytes)}


class ImportAhead:
    """A restore's device import while CRIU restores the tree, not after it (DEVICE RESTORE needs
    the restored runtime, but its data does not): once CRIU has made the process (pid, a child of
    `criu swrk`), the daemon reads and checks the images into memory it keeps for that process
    (pid and start time), which the runtime's `restore external` then takes back in place. The
    ordering stands: the process is LOCKED until the unlock, which the daemon refuses while any
    memory is missing, and nothing unchecked is kept. Any failure here only means the restore
    imports as usual (and reports what is wrong)."""

    POLL_S = 0.002

    def __init__(self, pid: int, socket: str, device_dir: Path, expected: Sequence[FileEntry]) -> None:
        self.pid, self.socket, self.device_dir, self.expected = pid, socket, device_dir, list(expected)
        self.criu: Optional[int] = None  # `criu swrk`'s pid, once it runs
        self.stop = threading.Event()
        self.done = False  # the memory is kept for the process
        self.error: Optional[BaseException] = None
        self.seconds = 0.0
        self.bytes = 0
        self.thread = threading.Thread(target=self._run, name="import-ahead", daemon=True)

    def criu_started(self, pid: int) -> None:
        self.criu = pid
        self.thread.start()

    def _restored(self) -> int:
        """The start time of the process CRIU made at pid, once it has (0: stopped first)."""
        from ..platform.procfs import proc_stat

        parents = {self.criu, os.getpid()}  # its parent: criu, or us once criu is gone
        while not self.stop.is_set():
            fields = proc_stat(self.pid)  # one read: ppid and start time of the same process
            if len(fields) > 20 and int(fields[2]) in parents:
                return int(fields[20])
            self.stop.wait(self.POLL_S)
        return 0

    def _run(self) -> None:
        try:
            start = self._restored()
            if start:
                began = time.monotonic()
                result = import_device(self.pid, self.device_dir, self.expected, self.socket, ahead_of=start)
                self.seconds, self.bytes = time.monotonic() - began, result.file_bytes
                self.done = True
        except BaseException as e:  # the restore's own import says what is wrong
            self.error = e

    def parts(self) -> Parts:
        """After CRIU returned: waits for it; its steps for the criu-restore phase's profile."""
        waited = time.monotonic()
        if not self.result():
            return {}
        return {"import-ahead": (self.seconds, self.bytes), "import-ahead-wait": (time.monotonic() - waited, 0)}

    def result(self) -> bool:
        """Waits for it (CRIU has returned): True when the memory is kept for the process."""
        self.stop.set()
        if self.thread.is_alive() or self.criu is not None:
            self.thread.join()
        return self.done


class DirectBackend(AgentBackend):
    method = DataPath.DIRECT

    def __init__(self, pid: int, name: BackendName) -> None:
        super().__init__(pid, name)
        self._images: Optional[tuple[Path, list[FileEntry]]] = None
        self.chain: list[Path] = []  # incremental: the ancestors' device directories, parent first
        self.lazy = False  # restore --lazy: the import returns before the data is in (lazy_status)
        self.ahead = False  # restore: an ImportAhead filled the memory (the import reads only if due)
        self._referenced = 0
        self.parts: Parts = {}  # the last backup's or restore's steps
        # --live: the daemon keeps the memory across the backup, so the resume right after the dump
        # takes it back in place instead of importing it (the images are for the disk only)
        self.keep = False
        # --live: the backup is the daemon's copy-on-write snapshot (at most this many bytes of
        # copies), written out by write_snapshot() once the workload runs on; None: an export
        self.snapshot_cap: Optional[int] = None
        self.snapped = False  # the daemon holds our snapshot, not written out yet

    def use_chain(self, device_dirs: Sequence[Path]) -> None:
        """Back up against the first (only what changed since its export is written) and restore
        through all of them."""
        self.chain = list(device_dirs)

    def describe(self) -> DeviceState:
        state = super().describe()
        state.method = self.method.value
        state.referenced = self._referenced
        return state

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        if device_dir is None:
            raise WrongState("the direct data path writes device images: it needs a directory")
        if self.snapshot_cap is not None:
            # First: a signal handled the instant the daemon answers (before an assignment after the
            # call) must still leave its snapshot to drop_snapshot(), which ends it "if any".
            self.snapped = True
            snapped = snapshot_device(self.pid, self.snapshot_cap, self.daemon)
            self._images = (device_dir, [])
            started = time.monotonic()
            self._call("backup", external=True)
            self.parts = {"snapshot": (snapped.seconds, 0), "backup-external": (time.monotonic() - started, 0)}
            return []
        # Not fsync'd here: the seal does it, after CRIU's dump, which runs while the disk writes them.
        exported = export_device(self.pid, device_dir, parent=self.chain[0] if self.chain else None,
                                 sync=False, keep=self.keep)
        testhooks.fail(f"after:export@{self.pid}", once=True)  # as a Ctrl-C: files written, not backed up
        self._referenced = exported.referenced_bytes
        self._images = (device_dir, exported.files)
        started = time.monotonic()
        self._call("backup", external=True)
        self.parts = {"export": (exported.seconds, exported.file_bytes),
                      "backup-external": (time.monotonic() - started, 0)}
        return exported.files

    def write_snapshot(self, device_dir: Path) -> list[FileEntry]:
        """--live: the images of the backup's snapshot written into device_dir (not fsync'd: the
        seal does it), the workload running or not; the daemon's snapshot ends with it."""
        written = export_device(self.pid, device_dir, self.daemon, parent=self.chain[0] if self.chain else None,
                                sync=False, from_snapshot=True)
        self.snapped = False  # ended in the daemon (a failed write-out ends it too; drop_snapshot() is harmless then)
        testhooks.disk(written.file_bytes)  # on the disk's queue, as an export's (the seal's fsync waits for it)
        self._referenced = written.referenced_bytes
        self._images = (device_dir, written.files)
        self.parts = {"export": (written.seconds, written.file_bytes), "copied-aside": (0.0, written.copied_bytes)}
        return written.files

    def images(self) -> list[FileEntry]:
        """The device images the last backup or write_snapshot() wrote."""
        return list(self._images[1]) if self._images is not None else []

    def drop_snapshot(self) -> None:
        """The snapshot will not be written (a failed or interrupted checkpoint): its copies freed."""
        if self.snapped:
            self.snapped = False
            try:
                drop_snapshot(self.pid, self.daemon)
            except NpusnapError:
                pass  # no daemon to ask: none holds it either

    def _take_back(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        """keep: the external restore takes the kept memory back in place, and the unlock needs no
        import; when the daemon refuses it (it did not keep all of it), the images bring the data,
        written from the snapshot first if there are none yet."""
        try:
            self.client.restore(external=True)
        except AgentProblem as e:
            raise agent_error(e, f"device restore (external) of process {self.pid}") from e
        try:
            unlock_unless_running(self)  # the daemon had all of the memory in place
            return
        except NpusnapError:
            pass
        if self.snapped:
            files = self.write_snapshot(device_dir)
        import_device(self.pid, device_dir, files, self.daemon, chain=self.chain)
        unlock_unless_running(self)

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        if device_dir is None and self._images is not None:
            device_dir, files = self._images
        if device_dir is None:
            raise WrongState(f"no device images to restore process {self.pid} from",
                             f"name them: npusnap recover {self.pid} --device-images DIR/device")
        # Without a file list (recover), every image in the directory is read; each chunk is still checked.
        self.parts = restore_direct(self.client, self.pid, device_dir, list(files) if files else None,
                                    self.daemon, chain=self.chain, lazy=self.lazy, ahead=self.ahead)

    def finish_after_commit(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        if self.keep and self.state() == State.BACKED_UP:
            self._take_back(device_dir, files)
            return
        super().finish_after_commit(device_dir, files)

    def back_to_running(self) -> None:
        state = self.state()
        try:
            self._back_to_running(state)
        finally:
            self.drop_snapshot()

    def _back_to_running(self, state: State) -> None:
        if state == State.BACKED_UP and (self.snapped or self.keep) and self._images is not None:
            self._take_back(*self._images)  # a rolled back snapshot backup: its memory was kept
            self.release()
            return
        if state == State.BACKED_UP:
            self.restore()
        if state in (State.LOCKED, State.BACKED_UP):
            try:
                self.unlock()
            except NpusnapError:
                # LOCKED after a failed import: the daemon refuses Unlock until the data is in.
                if state != State.LOCKED or self._images is None:
                    raise
                import_device(self.pid, self._images[0], self._images[1], chain=self.chain)
                self.unlock()
        self.release()
