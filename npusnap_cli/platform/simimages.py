"""The direct path for device memory (npusim only): the device daemon itself writes a locked
process's device memory into DIR/device/ and reads it back, so the data never passes through the
process (no doubled host memory, written once, zero chunks elided, checksummed while streaming).
The files are opened here, with our rights, and handed to the daemon as descriptors.

Checkpoint, in the pipeline's order (each with its undo):

    lock                      -> undo: unlock
    export_device             -> undo: none needed (the device is untouched; a failed export leaves
                                 no files and the process LOCKED: the lock's undo unlocks it)
    backup external (agent)   -> undo: backends/direct.restore_direct(), i.e. restore external + import_device
                                 from the staging dir, then the lock's undo unlocks
    CRIU dump, seal (the device files' checksums come from the export: never re-read; their fsync,
    left by the export, is the seal's, so their write-back overlaps the dump), commit

Restore: CRIU restore -> restore external (agent) -> import_device -> unlock. A failure after
CRIU restore kills the restored tree (the process never runs on a half-imported device: the
daemon refuses its Unlock until an import succeeded). core/restore.py runs the import ahead,
while CRIU restores (import_device with ahead_of: into memory the daemon keeps for the restored
process), and after the restore external only an import still due (if_due).
"""

from __future__ import annotations

import errno as errno_mod
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ..errors import DeviceFailed, ImageInvalid, NpusnapError, PermissionProblem, StorageProblem, WrongState
from ..image.format import DEVICE_DIR, FileEntry

ACL_ERROR_INVALID_FILE = 100003  # the daemon's code for a corrupt or altered image


@dataclass
class TransferResult:
    files: list[FileEntry] = field(default_factory=list)  # paths relative to the checkpoint root
    allocations: int = 0
    bytes: int = 0           # device memory moved (allocation sizes)
    nonzero_bytes: int = 0   # of which not all-zero (on disk here or, referenced, up the chain)
    referenced_bytes: int = 0  # incremental: of which left in (export) or read from (import) the chain
    file_bytes: int = 0      # bytes written (export) or read (import)
    seconds: float = 0.0
    copied_bytes: int = 0    # written from a snapshot: bytes the workload's writes had copied aside first


def daemon_socket(pid: int, explicit: Optional[str] = None) -> str:
    """The npusim daemon that process pid uses: its NPUSIM_SOCKET as it started, else ours,
    else the default (the runtime reads the variable once at aclInit). A socket named by the
    target's environment must lie in a directory owned by root or the target's user and writable
    by nobody else; the daemon behind it must be root's or the target user's (the native client
    checks SO_PEERCRED)."""
    if explicit:
        return explicit
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        env, owner = [], -1
    for item in env:
        if item.startswith(b"NPUSIM_SOCKET=") and len(item) > len(b"NPUSIM_SOCKET="):
            sock = os.fsdecode(item.split(b"=", 1)[1])
            from .simdaemon import dir_problem

            problem = dir_problem(os.path.dirname(os.path.abspath(sock)), owner)
            if problem is not None:
                raise PermissionProblem(f"process {pid} names an npusim socket that cannot be trusted: {problem}",
                                        "pass the daemon's socket explicitly")
            return sock
    from .simdaemon import socket_path

    return socket_path()


def offers_direct(device: Optional[dict[str, Any]]) -> bool:
    """Whether a runtime's device info (npusimSnapshotInfo, through the agent) offers the direct path."""
    return bool(device and device.get("direct") is True)


def supports_direct(pid: int) -> bool:
    """True when process pid runs the npusim runtime with the direct path and the agent answers.
    A real CANN runtime lacks it (the pipeline then keeps the in-process path)."""
    from .agent import AgentClient, AgentProblem

    try:
        reply = AgentClient(pid).status()
    except AgentProblem:
        return False
    return offers_direct(reply.device)


def _entries(result: dict[str, Any]) -> list[FileEntry]:
    # The native client opened these files itself under these names; any other name is a lie.
    out = []
    for f in result.get("files", []):
        name = str(f["path"])
        if re.fullmatch(r"dev[0-9]{1,3}\.img", name) is None:
            raise DeviceFailed(f"the npusim daemon reported an unexpected file name: {name!r}")
        out.append(FileEntry(f"{DEVICE_DIR}/{name}", int(f["size"]), str(f["checksum"])))
    return out


def _result(data: dict[str, Any], key: str) -> TransferResult:
    return TransferResult(
        files=_entries(data), allocations=int(data.get("allocations", 0)), bytes=int(data.get("bytes", 0)),
        nonzero_bytes=int(data.get("nonzero_bytes", 0)), referenced_bytes=int(data.get("referenced_bytes", 0)),
        file_bytes=int(data.get(key, 0)),
        seconds=float(data.get("seconds", 0.0)),
    )


def _error(e: BaseException, doing: str) -> NpusnapError:
    if isinstance(e, OSError):
        if e.errno in (errno_mod.ENOSPC, errno_mod.EDQUOT):
            return StorageProblem(f"{doing} failed: no space left for the device images ({e.strerror})",
                                  "free space in the checkpoint's file system or choose another directory")
        if e.errno in (errno_mod.EACCES, errno_mod.EPERM, errno_mod.EROFS):
            return StorageProblem(f"{doing} failed: {e.strerror}",
                                  "npusnap opens the device images with your rights: check the directory's permissions")
        return StorageProblem(f"{doing} failed: {e.strerror or e}")
    code = getattr(e, "code", None)
    if code == ACL_ERROR_INVALID_FILE:
        return ImageInvalid(f"{doing} failed: {e}",
                            "the checkpoint's device images are corrupt; restore another checkpoint")
    if "not locked" in str(e):
        return WrongState(f"{doing} failed: {e}", "lock the process first")
    return DeviceFailed(f"{doing} failed: {e}")


def export_device(pid: int, device_dir: Path, socket: Optional[str] = None,
                  parent: Optional[Path] = None, sync: bool = True, keep: bool = False,
                  from_snapshot: bool = False) -> TransferResult:
    """Have the daemon write process pid's device memory into device_dir (DIR/device/), one file per
    device, fsync'd (sync=False: only their write-back started; the caller fsyncs them and the
    directory before it relies on them, as the seal does). The process must be LOCKED. On failure no
    file is left and the device is untouched (the process stays LOCKED: the pipeline's lock undo
    unlocks it). parent: the device directory of an earlier checkpoint of the process: only what
    changed since is written. keep (a live checkpoint): the daemon keeps the memory across the
    backup, for the restore right after to take back in place (its unlock then needs no import).
    from_snapshot: the images of the daemon's snapshot of the process (snapshot_device), running or
    not; the snapshot ends with this call."""
    import npusim

    try:
        data = npusim.export_client(daemon_socket(pid, socket), pid, os.fspath(device_dir),
                                    None if parent is None else os.fspath(parent), sync, keep, from_snapshot)
    except (OSError, npusim.AclError) as e:
        raise _error(e, f"device export of process {pid}") from e
    result = _result(data, "written_bytes")  # the client created the files 0600, O_EXCL
    result.copied_bytes = int(data.get("copied_bytes", 0))
    return result


def snapshot_device(pid: int, cap: int, socket: Optional[str] = None) -> TransferResult:
    """A live checkpoint's device backup: the daemon snapshots locked process pid's device memory
    copy-on-write, in microseconds and without a file (a chunk the workload writes before the images
    are written is copied aside first, at most cap bytes at once: a write beyond waits for
    export_device(from_snapshot=True) to pass that chunk), and keeps it across the backup as keep
    does."""
    import npusim

    try:
        data = npusim.snapshot_client(daemon_socket(pid, socket), pid, max(0, cap))
    except (OSError, npusim.AclError) as e:
        raise _error(e, f"device snapshot of process {pid}") from e
    return _result(data, "written_bytes")


def drop_snapshot(pid: int, socket: Optional[str] = None) -> None:
    """Ends the daemon's snapshot of process pid, if any (its copies are freed); nothing is written."""
    import npusim

    try:
        npusim.export_client(daemon_socket(pid, socket), pid, None, from_snapshot=True)
    except (OSError, npusim.AclError) as e:
        raise _error(e, f"dropping the device snapshot of process {pid}") from e


def import_device(pid: int, device_dir: Path, expected: Optional[Iterable[FileEntry]],
                  socket: Optional[str] = None, chain: Sequence[Path] = (), lazy: bool = False,
                  ahead_of: int = 0, if_due: bool = False) -> TransferResult:
    """Have the daemon read exactly the expected device files (manifest entries, paths
    "device/devN.img") into process pid's re-created allocations (after `restore external`),
    verifying sizes, chunk checksums and each file's xxh3_128 while reading. chain: an incremental
    image's ancestors' device directories, parent first (each referenced chunk checked as read).
    lazy: only the structure is checked now; the data comes after (lazy_status). ahead_of: pid's
    start time, while CRIU restores it: the data goes, checked the same, into memory the daemon
    keeps for its `restore external` to take back (no import due then). if_due: nothing is read
    when no import is due (an import ahead's memory was taken back whole)."""
    import npusim

    wanted: Optional[list[tuple[str, int, str]]] = None if expected is None else []
    for f in expected or ():
        parts = Path(f.path).parts
        if len(parts) != 2 or parts[0] != DEVICE_DIR:
            raise ImageInvalid(f"unexpected device image path in the manifest: {f.path!r}")
        assert wanted is not None
        wanted.append((parts[1], int(f.size), f.checksum))
    try:
        data = npusim.import_client(daemon_socket(pid, socket), pid, os.fspath(device_dir), wanted,
                                    [os.fspath(p) for p in chain] or None, lazy, ahead_of, if_due)
    except (OSError, npusim.AclError) as e:
        raise _error(e, f"device import into process {pid}") from e
    return _result(data, "read_bytes")


def lazy_status(pid: int, socket: Optional[str] = None, wait_s: float = 0.0) -> dict[str, Any]:
    """The daemon's background fill of a lazy import into process pid (state none, filling, done
    or failed; chunks, ready, bad, errors), waiting up to wait_s for its end."""
    import npusim

    try:
        return dict(npusim.lazy_status(daemon_socket(pid, socket), pid, int(wait_s * 1000)))
    except (OSError, npusim.AclError) as e:
        raise _error(e, f"the lazy device restore of process {pid}") from e
