"""Writing a checkpoint: a staging directory beside DIR, renamed into place on commit; CRIU's
images hashed and flowing to disk while it dumps (checksums.Follower), fsync'd at the seal."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from .. import testhooks
from ..errors import ImageInvalid, StorageProblem
from .checksums import Follower, fsync_all, fsync_path, start_writeback
from .format import (
    CHECKSUMMED_DIRS,
    CRIU_DIR,
    DEVICE_DIR,
    LOG_DIR,
    MANIFEST,
    FileEntry,
    Manifest,
    checksum_file,
    hidden_sibling,
    image_files,
    load_manifest,
    manifest_text,
)

if TYPE_CHECKING:
    from .store import Packer


class Staging:
    """A checkpoint under construction: a 0700 sibling directory renamed into place on commit.

    DIR must be absent, an empty directory, or (with replace) a checkpoint whose
    manifest npusnap can read: never a file, a device node or a symlink, which a
    rename would silently take the place of. Commit checks again, atomically."""

    def __init__(self, final: Path, replace: bool = False, create: bool = True) -> None:
        """create=False: checked and named only; create() makes it, once the caller has registered
        discard() (a Ctrl-C in between then leaves nothing behind)."""
        self.final = final.absolute()
        self.replace = replace
        self.found = _check_target(self.final, replace)  # what DIR was, to recognise it at commit
        parent = self.final.parent
        if not parent.is_dir():
            raise StorageProblem(f"{parent} does not exist", "create the parent directory first")
        self.path = hidden_sibling(self.final, "partial")
        self.committed = False
        self.followers: list[Follower] = []  # one per dump (a process set dumps each member apart)
        self.parts: dict[str, tuple[float, int]] = {}  # the last seal's steps: (seconds, bytes)
        if create:
            self.create()

    log_dir: Path  # CRIU's logs until the commit (create())

    def create(self) -> None:
        try:
            os.mkdir(self.path, 0o700)
            for sub in (CRIU_DIR, DEVICE_DIR, LOG_DIR):
                os.mkdir(self.path / sub, 0o700)
            # Logs are written outside until commit: a failed checkpoint is removed
            # but its logs survive for the error message to point at.
            self.log_dir = Path(tempfile.mkdtemp(prefix=f"npusnap-logs-{_safe_prefix(self.final.name)}-"))
        except OSError as e:
            shutil.rmtree(self.path, ignore_errors=True)
            raise StorageProblem(f"cannot create the checkpoint next to {self.final}: {e.strerror}") from e

    @property
    def criu_dir(self) -> Path:
        return self.path / CRIU_DIR

    @property
    def device_dir(self) -> Path:
        return self.path / DEVICE_DIR


    def follow(self, directory: Path, packing: bool = False) -> Follower:
        """Around the writing of directory (CRIU's dump): its files are hashed and their write-back
        started while they are written; seal() takes those checksums instead of reading again."""
        skip: Optional[re.Pattern[str]] = None
        if packing:  # the chunk store's module only with --dedup/--compress, not on every checkpoint's path
            from .store import PAGE_IMAGE

            skip = PAGE_IMAGE  # hashed by the packer as it reads them: once, after CRIU
        follower = Follower(directory, skip=skip)
        self.followers.append(follower)
        return follower

    def seal(self, known: Sequence[FileEntry] = (), packer: Optional["Packer"] = None) -> list[FileEntry]:
        """Make images 0600, fsync them, and return their manifest entries. Files in
        `known` were checksummed by whoever wrote them (the device export, while streaming):
        they are only checked for size, never read again, and fsync'd with the rest. Files the
        follower hashed while they were written are not read again either. With a packer, CRIU's
        page images move into the chunk store (store.py) instead of being fsync'd here."""
        started = time.monotonic()
        written = {f.path: f for f in known}
        hashed: dict[str, tuple[int, str]] = {}
        for follower in self.followers:
            base = follower.directory.relative_to(self.path)
            try:
                hashed.update({str(base / name): v for name, v in follower.digests().items()})
            except OSError:
                pass  # read again below
        entries = []
        to_sync = []
        rels = list(image_files(self.path))
        packed = {str(rel) for rel in rels if packer is not None and packer.takes(str(rel))}
        for rel in rels:  # the disk starts writing what is left now, while we checksum from the page cache
            if str(rel) not in written and str(rel) not in hashed and str(rel) not in packed:
                _start_writeback(self.path / rel)
        for rel in rels:
            p = self.path / rel
            os.chmod(p, 0o600)
            entry = written.pop(str(rel), None)
            if entry is not None:
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
                    raise ImageInvalid(f"{rel} changed after it was written")
                to_sync.append(p)  # the export leaves it to us: its write-back overlapped CRIU's dump
            elif str(rel) in packed:
                assert packer is not None
                entry = packer.pack(p, FileEntry(str(rel), os.lstat(p).st_size, ""))
            else:
                size, digest = hashed.get(str(rel), (-1, ""))
                if size != os.lstat(p).st_size:
                    size, digest = checksum_file(p)
                entry = FileEntry(str(rel), size, digest)
                to_sync.append(p)
            entries.append(entry)
        if written:
            raise ImageInvalid(f"{sorted(written)[0]} is missing from the checkpoint")
        # Their write-back started long ago: these mostly wait for the last pages and the disk's
        # cache flush, which concurrent fsyncs share instead of paying one each.
        if packer is not None:
            to_sync += packer.store.to_sync()
        # the device export charged itself as it was written; CRIU's images go to the disk now
        testhooks.disk(sum(e.size for e in entries if not e.chunks and e.path not in {f.path for f in known}), 0)
        checked = time.monotonic()
        fsync_all([*to_sync, *(self.path / sub for sub in CHECKSUMMED_DIRS)])
        self.parts = {"checksums": (checked - started, 0),
                      "fsync": (time.monotonic() - checked, sum(e.size for e in entries))}
        return entries

    def commit(self, manifest: Manifest) -> Path:
        """Write the manifest last, fsync, and rename into place. The manifest and the staging
        directory's entry for it are fsync'd at once (they share the disk's cache flush), both
        before the rename: nothing makes DIR valid but that rename, which comes after them."""
        try:
            tmp = self.path / (MANIFEST + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(manifest_text(manifest.to_dict()))
            os.rename(tmp, self.path / MANIFEST)
            for p in self.log_dir.iterdir():
                os.chmod(p, 0o600)
                shutil.move(str(p), self.path / LOG_DIR / p.name)
            os.rmdir(self.log_dir)
            fsync_all([self.path / MANIFEST, self.path])
            self._put_in_place()
            fsync_path(self.final.parent)
        except OSError as e:
            if not self.committed:
                raise StorageProblem(f"cannot write the checkpoint: {e.strerror}") from e
            # Renamed into place: the checkpoint stands; what failed after was tidying up.
        self.committed = True
        return self.final

    def discard(self) -> None:
        """Remove an uncommitted checkpoint. Its logs stay where they were written
        (a private temporary directory), so an error's hint can point at them."""
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(OSError, AttributeError):  # gone when a late commit step failed,
                os.rmdir(self.log_dir)                          # never made; removed only when empty


    def _put_in_place(self) -> None:
        """Rename the staging directory to DIR, checking again what DIR is now: a
        checkpoint swapped out only if it is the one checked at start, and otherwise
        nothing ever replaced (RENAME_NOREPLACE)."""
        if self.found is None or self.found == _EMPTY:
            if self.found == _EMPTY:
                try:
                    os.rmdir(self.final)  # fails if DIR is no longer an empty directory
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise _changed(self.final, e.strerror or str(e)) from e
            try:
                _rename(self.path, self.final, RENAME_NOREPLACE)
            except FileExistsError:
                raise _changed(self.final, "something was created there") from None
            self.committed = True
            return
        # Swap in one step: DIR holds the old checkpoint or the new one, never neither.
        _rename(self.path, self.final, RENAME_EXCHANGE)
        swapped = _identity(self.path)  # what DIR held an instant ago
        if swapped != self.found:
            _rename(self.path, self.final, RENAME_EXCHANGE)  # put it back untouched
            raise _changed(self.final, "it was replaced by something else")
        self.committed = True
        old = hidden_sibling(self.final, "old")
        os.rename(self.path, old)  # self.path now holds the replaced checkpoint
        shutil.rmtree(old, ignore_errors=True)


_EMPTY = (-1, -1)  # Staging.found for an empty directory: removed, not swapped, at commit
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def _identity(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _changed(final: Path, why: str) -> StorageProblem:
    return StorageProblem(f"{final} changed while the checkpoint was written ({why}); nothing was replaced",
                          "run the checkpoint again")


def _refuse(final: Path, what: str) -> StorageProblem:
    return StorageProblem(f"{final} {what}; npusnap writes only a new directory, an empty one, "
                          "or (with --replace) a checkpoint it wrote",
                          "choose another directory")


def _check_target(final: Path, replace: bool) -> Optional[tuple[int, int]]:
    """What -D names, refused unless it is safe to write: None (absent), _EMPTY
    (an empty directory) or the (dev, inode) of the checkpoint --replace replaces."""
    if final.name in ("", ".", ".."):
        raise StorageProblem(f"{final} cannot hold a checkpoint: -D must name the directory to create",
                             "pass a path like /ckpt/job1")
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StorageProblem(f"cannot look at {final}: {e.strerror}") from e
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(final, "is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "a device, socket or pipe"
        raise _refuse(final, f"is {kind}, not a directory")
    try:
        fd = os.open(final, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise StorageProblem(f"cannot open {final}: {e.strerror}") from e
    try:
        names = os.listdir(fd)
        fst = os.fstat(fd)
    finally:
        os.close(fd)
    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
        raise _changed(final, "it was replaced while being checked")
    if not names:
        return _EMPTY
    if MANIFEST not in names:
        raise _refuse(final, "exists, is not empty and holds no checkpoint")
    if not replace:
        raise StorageProblem(f"{final} already holds a checkpoint",
                             "choose another directory, or pass --replace to replace it")
    try:
        load_manifest(final)
    except ImageInvalid as e:
        raise _refuse(final, f"does not hold a checkpoint npusnap can read ({e.message})") from None
    return (st.st_dev, st.st_ino)


def _safe_prefix(name: str) -> str:
    """A name for a temporary directory's prefix: printable ASCII, short."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64]


def _rename(a: Path, b: Path, flags: int) -> None:
    """renameat2(2): RENAME_EXCHANGE swaps two paths atomically, RENAME_NOREPLACE
    fails with EEXIST rather than replace whatever is at b."""
    import ctypes

    AT_FDCWD = -100
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(b))


def _start_writeback(p: Path) -> None:
    """Begin writing a file's dirty pages, without waiting."""
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        start_writeback(fd)
    finally:
        os.close(fd)
