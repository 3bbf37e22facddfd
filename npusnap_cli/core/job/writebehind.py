"""--stage: a job checkpoint's node written to node-local storage first, then copied to the job's
staging directory on the shared storage before its node votes (write-behind).

    stage_root   a fresh 0700 directory of this worker's own under the operator's --stage DIR,
                 which must be a real directory owned by us or root, and not writable by others
                 unless sticky (as /tmp): nobody else can plant or swap anything in our path
    copy_sealed  the sealed images, one thread per rank: large sequential reads and writes, the
                 bytes hashed on the way and compared with the seal's checksums, each file fsync'd;
                 packed images (--dedup, --compress) as their chunks, from the node-local chunk
                 store beside the local set into the shared one beside the node's copy (the job
                 checkpoint's nodes/.npusnap-store, as without --stage), each checked against its
                 digest and stored once however many ranks and nodes hold it
    copy_tail    after the node's set committed locally: its logs, then its manifest (fsync'd)

The shared copy lives inside the coordinator's staging directory, so the job's commit rule is
unchanged: nothing is committed before every node's copy is there and its manifest matches."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ...errors import ImageInvalid, PermissionProblem, StorageProblem
from ...image.checksums import fsync_all, fsync_path
from ...image.format import CHUNK, LOG_DIR, MANIFEST, FileEntry, new_hasher
from ...image.store import Store, chunks_of, store_of


def stage_root(base: Path, job: str, node: str) -> Path:
    """A new private directory under base (the node-local --stage DIR) for this worker's set.
    PermissionProblem for a base somebody else could have planted or could write into;
    StorageProblem when it cannot be created."""
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(base):
            raise PermissionProblem(f"--stage {base} is a symbolic link",
                                    "name the node-local directory itself, not a link to it") from e
        raise StorageProblem(f"--stage {base}: {e.strerror}", "create the node-local directory first") from e
    try:
        _trusted(base, os.fstat(fd))
        name = f"npusnap-job-{job}-{node}-{secrets.token_hex(4)}"
        try:
            os.mkdir(name, 0o700, dir_fd=fd)  # in the directory we checked, whatever its path is now
        except OSError as e:
            raise StorageProblem(f"cannot create a staging directory in --stage {base}: {e.strerror}") from e
        root = base / name
        try:
            st = os.lstat(root)
        except OSError as e:
            raise PermissionProblem(f"--stage {base} changed while the staging directory was created") from e
        if os.stat(name, dir_fd=fd, follow_symlinks=False).st_ino != st.st_ino or not stat.S_ISDIR(st.st_mode):
            raise PermissionProblem(f"--stage {base} changed while the staging directory was created")
        return root
    finally:
        os.close(fd)


def _trusted(base: Path, st: os.stat_result) -> None:
    if st.st_uid not in (os.geteuid(), 0):
        raise PermissionProblem(f"--stage {base} belongs to uid {st.st_uid}, not to us or root",
                                "use a node-local directory of your own (or root's, as /tmp)")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise PermissionProblem(f"--stage {base} is writable by everybody and not sticky "
                                f"(mode {stat.S_IMODE(st.st_mode):o})",
                                "use a directory only you can write, or a sticky one (chmod +t)")


def remove(root: Optional[Path]) -> None:
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def copy_sealed(src: Path, dst: Path, files: Sequence[FileEntry], members: Sequence[int],
                origin: float) -> dict[int, dict[str, Any]]:
    """Copy the sealed files src/REL -> dst/REL: each member's (criu/PID/, device/PID/) on a thread
    of its own, anything else after. Each member's write-behind as a phase: seconds, bytes and
    its start in seconds since origin (monotonic: the set's lock). StorageProblem on the first
    failure (a full shared directory), ImageInvalid when a file is not what the seal says."""
    by_member: dict[int, list[FileEntry]] = {pid: [] for pid in members}
    rest: list[FileEntry] = []
    for f in files:
        parts = Path(f.path).parts
        owner = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        (by_member[owner] if owner in by_member else rest).append(f)
    phases: dict[int, dict[str, Any]] = {}
    failed: list[BaseException] = []

    def member(pid: int) -> None:
        start = time.monotonic()
        try:
            nbytes = sum(_copy(src, dst, f) for f in by_member[pid] if not f.chunks)
            nbytes += _copy_chunks(src, dst, [f for f in by_member[pid] if f.chunks])
        except BaseException as e:  # raised by the caller, once every thread has ended
            failed.append(e)
            return
        phases[pid] = {"name": "write-behind", "seconds": round(time.monotonic() - start, 6), "bytes": nbytes,
                       "start": round(start - origin, 6)}

    threads = [threading.Thread(target=member, args=(pid,), name=f"write-behind-{pid}") for pid in by_member]
    for th in threads:
        th.start()
    for th in threads:
        th.join()  # each bounded by the storage's own errors; the coordinator's deadline is over all
    if failed:
        raise failed[0]
    _copy_chunks(src, dst, [f for f in rest if f.chunks])
    for f in rest:
        if not f.chunks:
            _copy(src, dst, f)
    _sync_dirs(dst)
    return phases


def copy_tail(src: Path, dst: Path) -> None:
    """The committed local set's logs (best effort: they are not checksummed) and then its
    manifest, which makes the shared copy whole."""
    logs = src / LOG_DIR
    for p in sorted(logs.iterdir()) if logs.is_dir() else []:
        if p.is_file() and not p.is_symlink():
            try:
                _copy_file(p, dst / LOG_DIR / p.name)
            except OSError:
                pass
    try:
        _copy_file(src / MANIFEST, dst / MANIFEST)
        fsync_path(dst)
    except OSError as e:
        raise StorageProblem(f"write-behind of the node's manifest to {dst}: {e.strerror}") from e


def _copy_chunks(src: Path, dst: Path, packed: Sequence[FileEntry]) -> int:
    """The chunks of packed files: src's chunk store -> dst's (created as a checkpoint creates it)."""
    if not packed:
        return 0
    try:
        with Store(store_of(src)) as local, Store(store_of(dst), create=True) as shared:
            nbytes = sum(local.copy_to(shared, c, f.path) for f in packed for c in chunks_of(f))
            fsync_all(shared.to_sync())
    except OSError as e:
        raise StorageProblem(f"write-behind of the chunks of {packed[0].path} to {store_of(dst)}: {e.strerror}",
                             "free space on the shared storage, or checkpoint without --stage") from e
    return nbytes


def _copy(src: Path, dst: Path, f: FileEntry) -> int:
    if Path(f.path).is_absolute() or ".." in Path(f.path).parts:
        raise ImageInvalid(f"{f.path}: not a file of a job's node checkpoint")
    try:
        size, digest = _copy_file(src / f.path, dst / f.path)
    except OSError as e:
        raise StorageProblem(f"write-behind of {f.path} to {dst}: {e.strerror}",
                             "free space on the shared storage, or checkpoint without --stage") from e
    if size != f.size or digest != f.checksum:
        raise ImageInvalid(f"write-behind: {src / f.path} is not what the seal checksummed",
                           "the node-local copy changed after the seal: check the node's storage")
    return size


def _copy_file(src: Path, dst: Path) -> tuple[int, str]:
    """src -> dst (created new, 0600; parents 0700), hashed on the way, fsync'd."""
    dst.parent.mkdir(0o700, parents=True, exist_ok=True)
    h = new_hasher()
    size = 0
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fin).st_mode):
            raise ImageInvalid(f"{src} is not a regular file")
        os.posix_fadvise(fin, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            buf = bytearray(max(1, min(CHUNK, os.fstat(fin).st_size)))
            view = memoryview(buf)
            while True:
                n = os.readv(fin, [view])
                if not n:
                    break
                h.update(view[:n])
                done = 0
                while done < n:
                    done += os.write(fout, view[done:n])
                size += n
            os.fsync(fout)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return size, h.hexdigest()


def _sync_dirs(root: Path) -> None:
    for dirpath, _, _ in os.walk(root):
        fsync_path(Path(dirpath))
