"""The chunk store: CRIU's page images (and, with --compress, direct device images) kept as
content-addressed chunks, each stored once.

    PARENT/.npusnap-store/          beside the checkpoints (0700, ours, never a link)
        lock                        flock: shared while a checkpoint adds or references chunks,
                                    exclusive while prune collects the unreferenced ones
        auto-verdict                --compress auto's last verdict here (compressing pays, or
                                    plain wins), with the rates it measured: later auto
                                    checkpoints follow it without probing (Verdict)
        packs/ID.pack               the chunks one run added, back to back, each as stored (raw,
                                    zstd or lz4); a chunk is named by its xxh3-128 (of the raw bytes)
        packs/ID.idx                where each of them is: "HEX CODEC OFFSET STORED" a line; written
                                    once the pack's data is on the disk, so a chunk another
                                    checkpoint can find is always there whole

A pack per run, not a file per chunk: creating a file costs far more than writing 64 KiB into
one (0.8 ms of CPU for an inode on the development machine's file system), and a first
checkpoint into a store writes thousands of chunks. A pack without its index (a run that failed
or was killed) holds nothing anyone references; prune deletes it, and rewrites a pack only some
of whose chunks are still referenced.

A packed image is listed in the manifest with its size and checksum as before, plus its
chunks ("HEX CODEC SIZE STORED" each, in order); the file itself is not in the checkpoint.
An unchanged page range costs nothing the second time: its chunk is already there. Restore
reassembles the file for CRIU, checking each chunk's digest and the whole file's checksum.

The store is shared by the checkpoints of one directory only, so that `prune DIR` sees every
manifest that may reference a chunk before it deletes one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import stat
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterable, Iterator, Optional, Sequence

from .. import testhooks
from ..errors import ImageInvalid, NpusnapError, StorageProblem
from .checksums import fsync_all, start_writeback, wait_writeback
from .codecs import AUTO_CODEC, Race, decompress
from .format import DEVICE_IMAGE, MANIFEST, FileEntry, load_manifest, new_hasher, packable, packed_entries

STORE_NAME = ".npusnap-store"
CHUNK_SIZE = 64 << 10  # page-aligned; small enough that a changed page rewrites little
_PREFER = {"zstd": 0, "lz4": 1, "raw": 2}  # which stored copy of the same bytes a new reference takes
_NAME = re.compile(r"^([0-9a-f]{32})\.(raw|zstd|lz4)$")
PACKS = "packs"
LEGACY = "chunks"  # a store written before packs: a file a chunk (read, and collected, only)
_PACK = re.compile(r"^([0-9a-f]{16}-[0-9]+-[0-9a-f]{8})\.(pack|idx|tmp)$")  # tmp: an index being written
_LINES = re.compile(r"^([0-9a-f]{32}) (raw|zstd|lz4) ([0-9]+) ([0-9]+)$", re.MULTILINE)
PAGE_IMAGE = re.compile(r"pages-[0-9]+\.img")  # CRIU's page images, the ones packed
DEVICE_HEADER = 64  # cut off first, so that the device's chunks fall on our chunk boundaries
# A device image's chunk: the daemon's own (it tracks changes per MiB), and one file (fsync'd) per
# MiB instead of 16.
DEVICE_CHUNK = 1 << 20
MAX_STORED = 2 * DEVICE_CHUNK  # no chunk is larger raw than a device chunk, nor grows this much compressed
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Chunk:
    """One chunk in the store: its digest, codec and sizes."""

    digest: str
    codec: str   # raw | zstd | lz4
    size: int    # raw bytes
    stored: int  # bytes in the store

    def text(self) -> str:
        return f"{self.digest} {self.codec} {self.size} {self.stored}"

    @classmethod
    def parse(cls, text: Any, where: str) -> "Chunk":
        parts = text.split() if isinstance(text, str) else []
        if (len(parts) != 4 or not _NAME.match(f"{parts[0]}.{parts[1]}") or not all(p.isdigit() for p in parts[2:])
                or int(parts[2]) > DEVICE_CHUNK or int(parts[3]) > MAX_STORED):
            raise ImageInvalid(f"manifest.yaml is malformed: {where} lists a chunk {text!r}")
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))

    @property
    def name(self) -> str:
        return f"{self.digest}.{self.codec}"


def chunks_of(entry: FileEntry) -> list[Chunk]:
    return [Chunk.parse(c, entry.path) for c in entry.chunks]


def store_of(root: Path) -> Path:
    return root.absolute().parent / STORE_NAME


# ---------------------------------------------------------------- the writer's pace

PACE = 8 << 20  # bytes whose write-back may be under way before the writer waits for the oldest's
BATCH = 1 << 20  # bytes whose write-back starts at once (one call, not one a chunk)


class Pacer:
    """Keeps the writer at the disk's speed: the write-back of what it wrote starts a BATCH at a
    time, and once more than PACE bytes are under way the writer waits for the oldest batch's to
    end. Without it the chunks would go to the page cache at memory speed and the disk's speed
    would show only in the seal's fsync, too late for auto to race against it (codecs.py)."""

    def __init__(self) -> None:
        self.ranges: deque[tuple[int, int, int]] = deque()  # (fd, offset, length) under way
        self.bytes = 0
        self.pending: Optional[tuple[int, int, int]] = None  # written, its write-back not started yet

    def wrote(self, fd: int, offset: int, size: int) -> None:
        p = self.pending
        if p is not None and p[0] == fd and p[1] + p[2] == offset:
            self.pending = (fd, p[1], p[2] + size)
        else:
            self._start()
            self.pending = (fd, offset, size)
        if self.pending[2] >= BATCH:
            self._start()
        testhooks.disk(size, PACE)
        while self.bytes > PACE:
            fd, offset, n = self.ranges.popleft()
            wait_writeback(fd, offset, n)
            self.bytes -= n

    def _start(self) -> None:
        if self.pending is not None:
            start_writeback(*self.pending)
            self.ranges.append(self.pending)
            self.bytes += self.pending[2]
            self.pending = None

    def close(self) -> None:
        """What is still being written is the seal's to wait for (Store.to_sync)."""
        self._start()
        self.ranges.clear()
        self.bytes = 0


# ---------------------------------------------------------------- the store directory

def _own_dir(path: Path, create: bool) -> int:
    """Open (creating if asked, 0700) a directory of ours: no link, owned by us, not writable by others."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _OPEN)
    except FileNotFoundError:
        raise ImageInvalid(f"the chunk store {path} is missing",
                           "the checkpoint's packed images live there; restore it from a backup") from None
    except OSError as e:
        raise StorageProblem(f"cannot open the chunk store {path}: {e.strerror} (a symbolic link?)") from e
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise StorageProblem(f"{path} is not a private directory of ours; refusing to use it as a chunk store",
                             "remove it, or check who created it")
    return fd


LOCK_WAIT_S = 60.0


def _flock(fd: int, how: int, path: Path) -> None:
    """flock, waiting at most LOCK_WAIT_S (a prune collecting, or a checkpoint being written)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise StorageProblem(f"the chunk store {path} stayed locked for {LOCK_WAIT_S:.0f} s "
                                     "(a checkpoint writing to it, or a prune collecting)", "try again later") from None
            time.sleep(0.05)


def _new_id() -> str:
    """A new pack's id: unique across runs and machines sharing the store (_PACK)."""
    return f"{time.time_ns():016x}-{os.getpid()}-{os.urandom(4).hex()}"


@dataclass(frozen=True)
class Where:
    """A stored chunk's place: its pack, and its bytes there."""
    pack: str
    offset: int
    stored: int


class Store:
    """An open chunk store. Context manager: holds the store's lock (shared, or exclusive for
    collect) until closed. Chunks put() (by one writer at a time) go into a pack of this run's
    own, made findable (indexed) by to_sync(); one closed before that is deleted (nothing can
    reference its chunks)."""

    def __init__(self, path: Path, create: bool = False, exclusive: bool = False) -> None:
        self.path = path
        self.fd = _own_dir(path, create)
        self.known: Optional[dict[str, Where]] = None  # "HEX.CODEC" -> where (_load)
        self.best: dict[str, tuple[str, Where]] = {}  # HEX -> the codec and place find() answers
        self.readers: dict[str, int] = {}  # pack id -> descriptor, for reading
        self.pack = ""  # this run's pack being written (its id), "" when none
        self.pack_fd = -1
        self.end = 0  # the pack's size so far
        self.lines: list[str] = []  # its index, written by to_sync()
        self.adopted: list[tuple[str, int, list[str]]] = []  # (id, descriptor, index lines): adopt()ed files
        try:
            self.lock = os.open("lock", os.O_RDWR | os.O_CREAT | _OPEN, 0o600, dir_fd=self.fd)
            _flock(self.lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, path)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(PACKS, 0o700, dir_fd=self.fd)
            try:
                self.packs = os.open(PACKS, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=self.fd)
            except FileNotFoundError:
                self.packs = -1  # a store written before packs (LEGACY), or none of its runs finished
        except OSError as e:
            self.close()
            raise StorageProblem(f"cannot open the chunk store {path}: {e.strerror}") from e
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        unindexed = [(self.pack, self.pack_fd)] if getattr(self, "pack", "") else []
        for pack, fd in unindexed + [(a[0], a[1]) for a in getattr(self, "adopted", [])]:
            os.close(fd)  # never indexed: nobody can reference what it holds
            with contextlib.suppress(OSError):
                os.unlink(f"{pack}.pack", dir_fd=self.packs)
        self.pack, self.pack_fd, self.adopted = "", -1, []
        for fd in getattr(self, "readers", {}).values():
            os.close(fd)
        self.readers = {}
        for name in ("packs", "lock", "fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                os.close(fd)
            setattr(self, name, -1)

    def listing(self) -> dict[str, set[str]]:
        """Every pack id with the kinds of file it has ("pack", "idx")."""
        out: dict[str, set[str]] = {}
        for name in os.listdir(self.packs) if self.packs >= 0 else []:
            m = _PACK.match(name)
            if m:
                out.setdefault(m.group(1), set()).add(m.group(2))
        return out

    def entries(self, pack: str) -> list[tuple[str, str, Where]]:
        """A pack's index: (digest, codec, where) for each of its chunks; a malformed line is
        skipped (its chunk then counts as absent: a checkpoint stores it again, a restore says it
        is missing)."""
        try:
            fd = os.open(f"{pack}.idx", os.O_RDONLY | _OPEN, dir_fd=self.packs)
        except FileNotFoundError:
            return []
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return []
            text = f.read().decode("ascii", "replace")
        return [(digest, codec, Where(pack, int(offset), int(stored)))
                for digest, codec, offset, stored in _LINES.findall(text) if int(stored) <= MAX_STORED]

    def _load(self) -> dict[str, Where]:
        """Every indexed chunk, listed once (a checkpoint holds the lock: nothing it lists goes away)."""
        if self.known is None:
            self.known, self.best = {}, {}
            for pack, kinds in sorted(self.listing().items()):
                if "idx" in kinds and "pack" in kinds:
                    for digest, codec, where in self.entries(pack):
                        self._remember(digest, codec, where)
        return self.known

    def _remember(self, digest: str, codec: str, where: Where) -> None:
        """The chunk is stored at where; find() prefers a compressed copy of the same bytes."""
        assert self.known is not None
        self.known.setdefault(f"{digest}.{codec}", where)
        had = self.best.get(digest)
        if had is None or _PREFER[codec] < _PREFER[had[0]]:
            self.best[digest] = (codec, where)

    def find(self, digest: str) -> Optional[Chunk]:
        """A chunk with these raw bytes already stored (any codec), or None."""
        self._load()
        found = self.best.get(digest)
        return Chunk(digest, found[0], -1, found[1].stored) if found is not None else None

    def locate(self, chunk: Chunk) -> Optional[Where]:
        return self._load().get(chunk.name)

    def put(self, digest: str, codec: str, data: bytes | memoryview) -> tuple[int, int, int]:
        """Append one chunk to this run's pack (made on the first). Returns (descriptor, offset,
        length) of its bytes there, for the caller's pacing (Pacer)."""
        if not self.pack:
            pack = _new_id()
            self.pack_fd = os.open(f"{pack}.pack", os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600,
                                   dir_fd=self.packs)
            self.pack, self.end, self.lines = pack, 0, []
        offset = self.end
        view = memoryview(data)
        while view:
            view = view[os.pwrite(self.pack_fd, view, self.end):]
            self.end = offset + len(data) - len(view)
        self.lines.append(f"{digest} {codec} {offset} {len(data)}\n")
        if not offset:
            testhooks.pause("pack")  # a run killed from here leaves a pack nothing can find
        self._load()
        self._remember(digest, codec, Where(self.pack, offset, len(data)))
        return self.pack_fd, offset, len(data)

    def adopt(self, src: Path, chunks: Sequence[tuple[str, int, int]]) -> bool:
        """src, a file of this run's, made a pack as it is: renamed into the store, not copied.
        chunks: its raw chunks to index, (digest, offset, length); its other bytes (chunks the
        store had already) are never indexed, dead from the start, and prune counts them so.
        False where src is on another file system than the store: nothing done."""
        pack = _new_id()
        try:
            os.rename(src, f"{pack}.pack", dst_dir_fd=self.packs)
        except OSError as e:
            if e.errno == errno.EXDEV:
                return False
            raise
        fd = os.open(f"{pack}.pack", os.O_RDONLY | _OPEN, dir_fd=self.packs)
        self.adopted.append((pack, fd, [f"{digest} raw {offset} {length}\n" for digest, offset, length in chunks]))
        start_writeback(fd)  # CRIU's writes: nothing started them (they were to be copied)
        testhooks.pause("pack")  # a run killed from here leaves a pack nothing can find
        self._load()
        for digest, offset, length in chunks:
            self._remember(digest, "raw", Where(pack, offset, length))
        return True

    def to_sync(self) -> list[Path]:
        """This run's packs made findable: each one's data on the disk first, then its index,
        whole or not at all (written aside, fsync'd, renamed into place). Returns the
        directories, for the seal's one batch of fsyncs."""
        pending = [(self.pack, self.pack_fd, self.lines)] if self.pack else []
        pending += self.adopted
        self.pack, self.pack_fd, self.adopted = "", -1, []
        try:
            for pack, fd, lines in pending:  # one that fails is left unindexed, as a killed run's: prune deletes it
                os.fdatasync(fd)
                tmp = os.open(f"{pack}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600, dir_fd=self.packs)
                with os.fdopen(tmp, "w") as f:
                    f.write("".join(lines))
                    f.flush()
                    os.fdatasync(f.fileno())
                os.rename(f"{pack}.tmp", f"{pack}.idx", src_dir_fd=self.packs, dst_dir_fd=self.packs)
        finally:
            for _, fd, _ in pending:
                os.close(fd)
        return [self.path / PACKS, self.path] if pending else []

    def read(self, chunk: Chunk, where: str) -> bytes:
        """A chunk's raw bytes, checked against its digest."""
        return self._checked(chunk, self._stored(chunk, where), where)

    def copy_to(self, other: "Store", chunk: Chunk, where: str) -> int:
        """The chunk into other as it is stored here, checked against its digest on the way (a
        job's node staged with --stage: its node-local store into the shared one), unless other
        has it already; the bytes written."""
        if other.find(chunk.digest) is not None:
            return 0
        stored = self._stored(chunk, where)
        self._checked(chunk, stored, where)
        other.put(chunk.digest, chunk.codec, stored)
        return len(stored)

    def has(self, chunk: Chunk) -> bool:
        if self.locate(chunk) is not None:
            return True
        fd = self._legacy(chunk)
        if fd is not None:
            os.close(fd)
        return fd is not None

    def _stored(self, chunk: Chunk, where: str) -> bytes:
        at = self.locate(chunk)
        if at is not None:
            return os.pread(self._reader(at.pack, where), at.stored, at.offset)
        fd = self._legacy(chunk)
        if fd is None:
            raise ImageInvalid(f"{where}: chunk {chunk.digest} is missing from the store {self.path}",
                               "it was deleted by hand or the store is incomplete; restore from a backup")
        try:
            return os.read(fd, chunk.stored + 1)  # one more: a longer file is caught as corrupt
        finally:
            os.close(fd)

    def _legacy(self, chunk: Chunk) -> Optional[int]:
        """A chunk of a store written before packs (LEGACY/AB/HEX.CODEC, a file a chunk): read, never
        written, so that checkpoints of earlier versions still restore; prune collects them."""
        try:
            fd = os.open(f"{LEGACY}/{chunk.digest[:2]}/{chunk.name}", os.O_RDONLY | _OPEN, dir_fd=self.fd)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def legacy_names(self) -> Iterator[tuple[str, str]]:
        """(fan-out directory, name) of every chunk file of a store written before packs."""
        try:
            legacy = os.open(LEGACY, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=self.fd)
        except FileNotFoundError:
            return
        try:
            for sub in sorted(os.listdir(legacy)):
                if re.fullmatch(r"[0-9a-f]{2}", sub):
                    fan = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=legacy)
                    try:
                        names = os.listdir(fan)
                    finally:
                        os.close(fan)
                    yield from ((sub, name) for name in sorted(names) if _NAME.match(name))
        finally:
            os.close(legacy)

    def _reader(self, pack: str, where: str) -> int:
        fd = self.readers.get(pack)
        if fd is None:
            try:
                fd = os.open(f"{pack}.pack", os.O_RDONLY | _OPEN, dir_fd=self.packs)
            except OSError as e:
                raise ImageInvalid(f"{where}: cannot read the pack {pack} of the store {self.path}: {e.strerror}",
                                   "restore the store from a backup") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise ImageInvalid(f"{where}: the pack {pack} in {self.path} is not a regular file")
            self.readers[pack] = fd
        return fd

    def _checked(self, chunk: Chunk, stored: bytes, where: str) -> bytes:
        try:
            data = decompress(chunk.codec, stored, chunk.size) if len(stored) == chunk.stored else b""
        except Exception:
            data = b""
        h = new_hasher()
        h.update(data)
        if len(data) != chunk.size or h.hexdigest() != chunk.digest:
            raise ImageInvalid(f"{where}: chunk {chunk.digest} is corrupt (its bytes do not match their digest)",
                               "restore the store from a backup")
        return data

    def drop(self, pack: str, keep: Sequence[tuple[str, str, Where]]) -> int:
        """prune: a pack (or its index alone, or an unindexed pack) deleted, its chunks in keep
        first copied into a new pack of this run (to_sync'd before the old one goes). The bytes freed."""
        for digest, codec, at in keep:
            self.put(digest, codec, os.pread(self._reader(pack, digest), at.stored, at.offset))
        if keep:
            fsync_all(self.to_sync())
        freed = 0
        fd = self.readers.pop(pack, None)
        if fd is not None:
            os.close(fd)
        for kind in ("idx", "tmp", "pack"):  # the index first: no pack is ever listed without its data
            with contextlib.suppress(FileNotFoundError):
                size = os.stat(f"{pack}.{kind}", dir_fd=self.packs, follow_symlinks=False).st_size
                os.unlink(f"{pack}.{kind}", dir_fd=self.packs)
                freed += size if kind == "pack" else 0
        return max(0, freed - sum(at.stored for _, _, at in keep))


# ---------------------------------------------------------------- auto's remembered verdict

VERDICT = "auto-verdict"
# How long a verdict is followed. The disk's and the codec's rates drift with what else the
# machine runs, and a file system's st_dev (an anonymous one's: a tmpfs, NFS, overlay) may be
# another mount's after a remount; a day bounds what a stale verdict can cost (an auto checkpoint
# slower than it need be) while a job checkpointing every few minutes probes once a day, not
# each time (the probe itself stages the export in memory: what a remembered verdict saves).
VERDICT_TTL_S = 24 * 3600.0
_VERDICT_SKEW_S = 60.0  # a verdict from the future: a clock set back, or planted; judged afresh
_VERDICT_MAX = 4096


@dataclass(frozen=True)
class Verdict:
    """auto's verdict on one store's file system: whether compressing device images pays there
    (Race.pays), the rates it was judged on, the st_dev of the checkpoints' file system (the
    store's parent directory, where the probe wrote) and when (time.time())."""
    pays: bool
    disk_rate: float   # bytes/s: the probe's plain write, waited for
    codec_rate: float  # bytes/s: the codec's threads together
    ratio: float       # compressed / raw
    dev: int
    at: float

    def text(self) -> str:
        return json.dumps({"version": 1, "pays": self.pays, "disk_rate": round(self.disk_rate),
                           "codec_rate": round(self.codec_rate), "ratio": round(self.ratio, 4),
                           "st_dev": self.dev, "at": round(self.at, 3)}) + "\n"

    @classmethod
    def parse(cls, data: bytes, dev: int, now: float) -> Optional["Verdict"]:
        """The verdict data holds, if it is well formed, for the file system dev and fresh at
        now; else None (judged afresh)."""
        try:
            d = json.loads(data)
        except ValueError:
            return None
        if not isinstance(d, dict) or d.get("version") != 1 or not isinstance(d.get("pays"), bool):
            return None
        rates = [_positive(d.get(k)) for k in ("disk_rate", "codec_rate", "ratio", "at")]
        if not all(rates):
            return None
        st_dev = d.get("st_dev")
        if type(st_dev) is not int or st_dev != dev:
            return None
        disk_rate, codec_rate, ratio, at = rates
        if not now - VERDICT_TTL_S <= at <= now + _VERDICT_SKEW_S:
            return None
        return cls(d["pays"], disk_rate, codec_rate, ratio, dev, at)


def _positive(x: object) -> float:
    """x as a finite positive number (a JSON int or float, not a bool), or 0.0."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf else 0.0


def _fs_dev(final: Path) -> int:
    """st_dev of the file system the checkpoint (and its plain device images) is written to."""
    return os.stat(final.absolute().parent).st_dev


def read_verdict(store_fd: int, dev: int, now: Optional[float] = None) -> Optional[Verdict]:
    """The store's verdict (its directory open as store_fd), if one of ours is there and holds:
    a regular file, not followed through a link, owned by us and writable by no one else, small,
    well formed, for the file system dev, and fresh. None otherwise: auto judges afresh."""
    try:
        fd = os.open(VERDICT, os.O_RDONLY | os.O_NONBLOCK | _OPEN, dir_fd=store_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
                or st.st_size > _VERDICT_MAX):
            return None
        data = os.read(fd, _VERDICT_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return Verdict.parse(data, dev, time.time() if now is None else now)


def remembered(final: Path) -> Optional[Verdict]:
    """auto, before the device export: the verdict in the store beside final, if it holds (no
    store, or one that is not ours: None; the packer reports a store it cannot use)."""
    try:
        dev = _fs_dev(final)
        fd = _own_dir(store_of(final), create=False)
    except (OSError, NpusnapError):
        return None
    try:
        return read_verdict(fd, dev)
    finally:
        os.close(fd)


def write_verdict(store_fd: int, verdict: Verdict) -> None:
    """The verdict into the store, atomically (a temporary file renamed over the old one, or over
    whatever was planted under its name: the name is replaced, nothing is followed). Best effort:
    a verdict not written is judged again next time."""
    tmp = f".tmp-verdict-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600, dir_fd=store_fd)
        try:
            os.write(fd, verdict.text().encode())
        finally:
            os.close(fd)
        os.rename(tmp, VERDICT, src_dir_fd=store_fd, dst_dir_fd=store_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=store_fd)


# ---------------------------------------------------------------- checkpoint: pack

@dataclass
class PackStats:
    """What packing a checkpoint's images into the store wrote and reused."""

    raw_bytes: int = 0         # the images' size
    new_bytes: int = 0         # what this checkpoint added to the store
    referenced_bytes: int = 0  # raw bytes of chunks that were there already
    codec: str = "raw"
    plain_bytes: int = 0       # device images auto left as files in DIR (compressing did not pay)
    compressed_bytes: int = 0  # raw bytes of the new chunks stored compressed (auto: those its codec had ready)
    verdict: str = ""          # auto, device images: "probed" (judged by this checkpoint) or "remembered"
    pays: Optional[bool] = None  # auto, probed: whether its probe found that compressing pays here

    def recorded(self, choice: str) -> dict[str, Any]:
        return {"store": STORE_NAME, "compress": choice, "codec": self.codec, "raw_bytes": self.raw_bytes,
                "new_bytes": self.new_bytes, "referenced_bytes": self.referenced_bytes,
                "compressed_bytes": self.compressed_bytes,
                **({"plain_bytes": self.plain_bytes} if self.plain_bytes else {}),
                **({"verdict": self.verdict} if self.verdict else {}),
                **({"pays": self.pays} if self.pays is not None else {})}


AHEAD = 32 << 20  # bytes read ahead of the writer, for the codec's threads to work on
ADOPT = 0.75  # share of new bytes from which a page image becomes a pack as it is (Packer._raw)
PROBE = 16 << 20  # auto: the bytes of the first device image written plain, timed, before it judges


class Packer:
    """Moves a checkpoint's page images (and device images) into the store. Its lock (shared) is held from the first
    chunk until close(), after the commit: prune cannot collect a chunk this checkpoint found
    in the store before its manifest says so. Chunks are compressed (--compress) on the race's
    threads while the writer stores them (codecs.py: auto takes only what is ready in time).

    auto compresses device images only (CRIU has written the page images to the disk already:
    packing them again could only add writes; with --dedup they go to the store uncompressed),
    and only where it pays: device_image() writes the first PROBE bytes of the first image as the
    plain file it would otherwise be, timed to the disk, while the threads compress the same
    bytes; Race.pays() then judges, once for the checkpoint, and its verdict is kept in the store
    (Verdict). A later auto checkpoint into the same store follows a fresh one without a probe:
    compressing pays, it packs at once; plain wins, it does not even stage the export in memory
    (core/checkpoint.py: the export goes to the disk as with --compress none)."""

    def __init__(self, final: Path, choice: str, dedup: bool = False) -> None:
        self.choice = choice
        self.dedup = dedup
        self.runs: dict[str, list[tuple[int, int]]] = {}  # a page image's path -> its runs of pages (cuts)
        self.store = Store(store_of(final), create=True)
        self.race = Race(choice) if choice != "none" else None
        self.judged = choice != "auto"
        self.submitted = False  # auto: the probe's bytes are with the race's threads (_submit)
        self.stopped = False  # stop(): the checkpoint is being undone
        self.stats = PackStats()         # host pages
        self.device_stats = PackStats()  # device images
        self.dev = -1
        if choice == "auto":
            try:
                self.dev = _fs_dev(final)
            except OSError:
                pass
            verdict = read_verdict(self.store.fd, self.dev) if self.dev >= 0 else None
            if verdict is not None:  # followed, not probed again
                self.judged = True
                self.device_stats.verdict = "remembered"
                if not verdict.pays and self.race is not None:
                    self.race.close()
                    self.race = None

    def close(self) -> None:
        if self.race is not None:
            self.race.close()
        self.store.close()

    def stop(self) -> None:
        """From another thread: a pack under way ends at its next chunk (StorageProblem)."""
        self.stopped = True

    def _check(self) -> None:
        if self.stopped:
            raise StorageProblem("the checkpoint was stopped while its images went into the chunk store")

    def takes(self, path: str) -> bool:
        """Whether an image (its path in the checkpoint) goes into the store: a page image, with
        --dedup or a codec named."""
        return packable(path) and (self.dedup or self.choice in ("zstd", "lz4"))

    def add_runs(self, criu_dir: Path, runs: dict[str, list[tuple[int, int]]]) -> None:
        """The runs of pages of criu_dir's page images (platform/criu.page_runs), by image name."""
        self.runs.update({str(criu_dir / name): r for name, r in runs.items()})

    def device_image(self, src: Path, dst: Path, entry: FileEntry) -> Optional[FileEntry]:
        """A device image staged in memory (src): packed into the store and kept in memory (its
        entry, chunked), or, where auto finds that compressing does not pay here, written to dst
        as it is and fsync'd (None)."""
        probed = False
        if self.race is not None:
            if self.judged:
                return self.pack(src, entry, keep=True)
            self.judged = probed = True
            if self._probe(src, dst):
                return self.pack(src, entry, keep=True)
        from .memstage import send  # only here: only an image written plain needs it

        # plain: after the probe's bytes, if it wrote them (they are the file's start)
        testhooks.disk(send(src, dst, then=os.fsync, new=not probed, check=self._check), 0)
        return None

    def _probe(self, src: Path, dst: Path) -> bool:
        """auto's probe of an export staged in memory (a verdict said compressing pays, and was gone
        by the time the packer looked): _judge() with dst as the plain file it would be. True:
        compressing pays (dst removed); False: auto compresses no more (the caller writes dst on
        from there)."""
        if self._judge(src, dst):
            os.unlink(dst)
            return True
        return False

    def probe_ahead(self, sample: Path) -> None:
        """probe()'s compression of sample started now, on the threads, while the checkpoint's seal
        goes on (its checksums and fsync: the disk is busy, the CPUs are not)."""
        if not self.judged and self.race is not None and not self.submitted:
            self._submit(sample)

    def probe(self, sample: Path) -> None:
        """auto with no verdict here yet, once the checkpoint has written its device images plain
        (as none does: judging never makes it slower) and fsync'd them: _judge() on sample (one of
        them, still in the page cache), its bytes written to a scratch file in the store, which goes
        after. The verdict is for the next auto checkpoints here; this one stays plain. A probe that
        fails (the disk full) costs only the verdict: the next auto checkpoint judges again."""
        if self.judged or self.race is None:
            return
        self.judged = True
        scratch = self.store.path / f".probe-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            self._judge(sample, scratch)
        except (OSError, NpusnapError):
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(scratch)
        if self.race is not None:
            self.race.close()
            self.race = None

    def _judge(self, src: Path, dst: Path) -> bool:
        """src's first PROBE bytes written to dst plain (waited for: the disk's rate) while the
        threads compress them (the codec's rate and ratio); the verdict kept in the store. True:
        compressing pays; False: the race is closed, auto compresses no more."""
        assert self.race is not None
        if not self.submitted:
            self._submit(src)
        from .memstage import send

        t = time.perf_counter()
        n = send(src, dst, PROBE, then=wait_writeback)
        testhooks.disk(n, 0)
        rate = n / max(time.perf_counter() - t, 1e-9)
        self.race.settle()
        pays = bool(n) and self.race.pays(rate)
        self.device_stats.verdict, self.device_stats.pays = "probed", pays
        measured = self.race.measured()
        if n and measured is not None and self.dev >= 0:
            write_verdict(self.store.fd, Verdict(pays, rate, *measured, self.dev, time.time()))
        if not pays:
            self.race.close()
            self.race = None
        return pays

    def _submit(self, src: Path) -> None:
        """src's first PROBE bytes to the race's threads, for _judge()."""
        assert self.race is not None
        self.submitted = True
        with open(src, "rb", buffering=0) as f:
            for _ in range(0, PROBE, DEVICE_CHUNK):
                data = f.read(DEVICE_CHUNK)
                if not data:
                    break
                self.race.submit(data)

    def pack(self, path: Path, entry: FileEntry, keep: bool = False) -> FileEntry:
        """Store the file's chunks (checking the whole checksum on the way, or taking it where
        entry has none: a page image, read here for the first time), then remove it
        (keep: the caller still needs it, as a device image imported back for --leave-running)."""
        whole = new_hasher()
        device = bool(DEVICE_IMAGE.fullmatch(entry.path))
        stats = self.device_stats if device else self.stats
        lengths = iter(device_cuts(entry.size) if device else cuts(self.runs.get(str(path), []), entry.size))
        fd = os.open(path, os.O_RDONLY | _OPEN)
        try:
            image = _Mapped(fd)
            if self.race is None:
                chunks, gone = self._raw(path, image, lengths, whole, stats, adopt=not keep)
            else:
                chunks, gone = self._raced(image, lengths, whole, stats), False
        finally:
            os.close(fd)
        size, checksum = sum(c.size for c in chunks), whole.hexdigest()
        if size != entry.size or entry.checksum not in ("", checksum):
            raise ImageInvalid(f"{entry.path} changed while it was moved into the chunk store")
        if not keep and not gone:
            os.unlink(path)
        stats.raw_bytes += size
        if stats.compressed_bytes:
            stats.codec = AUTO_CODEC if self.choice == "auto" else self.choice
        return FileEntry(entry.path, entry.size, checksum, [c.text() for c in chunks])

    def _raw(self, path: Path, image: "_Mapped", lengths: Iterator[int], whole: Any, stats: PackStats,
             adopt: bool) -> tuple[list[Chunk], bool]:
        """No codec (--dedup alone): every chunk hashed and looked up first, then the new ones
        stored: copied into this run's pack, or, where they are at least ADOPT of the file (a
        first checkpoint into the store), the file itself made a pack (Store.adopt: nothing
        copied). The chunks, and whether the file went into the store whole."""
        cut: list[tuple[str, int, int, Optional[Chunk]]] = []  # digest, offset, length, the store's copy
        first: dict[str, int] = {}  # a new chunk's digest -> its first place in cut (the file may repeat it)
        at = new = 0
        for length in lengths:
            data = image.view[at:at + length]
            if not data:
                break
            self._check()
            whole.update(data)
            digest = _digest(data)
            found = self.store.find(digest)
            if found is None and digest not in first:
                first[digest] = len(cut)
                new += len(data)
            cut.append((digest, at, len(data), found))
            at += len(data)
            image.release(at)
        fresh = [cut[i][:3] for i in first.values()]
        gone = adopt and new >= ADOPT * at > 0 and self.store.adopt(path, fresh)
        if not gone:
            image.rewind()
            pacer = Pacer()
            try:
                for digest, offset, length in fresh:
                    self._check()
                    pacer.wrote(*self.store.put(digest, "raw", image.view[offset:offset + length]))
                    image.release(offset + length)
            finally:
                pacer.close()
        chunks = []
        for digest, _, length, found in cut:
            if found is None and first.pop(digest, None) is not None:
                stats.new_bytes += length
                chunks.append(Chunk(digest, "raw", length, length))
            else:
                stats.referenced_bytes += length
                chunks.append(Chunk(digest, found.codec, length, found.stored) if found is not None
                              else Chunk(digest, "raw", length, length))  # a repeat of a new one
        return chunks, gone

    def _raced(self, image: "_Mapped", lengths: Iterator[int], whole: Any, stats: PackStats) -> list[Chunk]:
        """With a codec: the chunks are read AHEAD of the writer, each new one handed to the
        race's threads, and stored compressed if the race has it so by the writer's turn."""
        race = self.race
        assert race is not None
        chunks = []
        ahead: deque[tuple[str, memoryview, Any]] = deque()
        pacer = Pacer()
        read = at = 0
        more = True
        try:
            while more or ahead:
                while more and read < AHEAD:
                    length = next(lengths, 0)
                    data = image.view[at:at + length]
                    at += len(data)
                    more = len(data) == length > 0
                    if not data:
                        break
                    whole.update(data)
                    digest = _digest(data)
                    ahead.append((digest, data, race.submit(data) if self.store.find(digest) is None else None))
                    read += len(data)
                if not ahead:
                    break
                self._check()
                digest, data, job = ahead.popleft()
                read -= len(data)
                chunks.append(self._one(digest, data, job, stats, pacer))
                image.release(at - read)
        finally:
            pacer.close()
        return chunks

    def _one(self, digest: str, data: bytes | memoryview, job: Any, stats: PackStats, pacer: Pacer) -> Chunk:
        """The writer's turn for one chunk: referenced if the store has it, else stored,
        compressed if the race has it so."""
        found = self.store.find(digest)  # also a chunk this image stored a moment ago
        race = self.race
        if found is not None:
            if job is not None and race is not None:
                race.drop(job)  # an earlier chunk of this image had the same bytes
            stats.referenced_bytes += len(data)
            return Chunk(digest, found.codec, len(data), found.stored)
        out = race.taken(job) if job is not None and race is not None else None
        codec, stored = ("raw", data) if out is None or race is None else (race.codec, out)
        pacer.wrote(*self.store.put(digest, codec, stored))
        stats.new_bytes += len(stored)
        stats.compressed_bytes += len(data) if out is not None else 0
        return Chunk(digest, codec, len(data), len(stored))


class _Mapped:
    """A file's bytes as a view of its mapping: its chunks are hashed and stored from the page
    cache without a copy. release(upto) unmaps the pages before upto once they are stored (read
    again, they fault back in from the page cache): what the process holds of the file stays what
    it reads ahead, not the file's size. Unmapped when the last view of it goes (a chunk's may
    outlive the caller on an error path, or sit in the codec's queue)."""

    STEP = 8 << 20  # bytes released at a time

    def __init__(self, fd: int) -> None:
        import mmap  # only here: only the packer reads through a mapping

        self.mmap = mmap
        size = os.fstat(fd).st_size
        self.map = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        self.view = memoryview(self.map) if self.map is not None else memoryview(b"")
        self.released = 0

    def rewind(self) -> None:
        """The file is read again from its start: its pages, mapped again, are given back again."""
        self.released = 0

    def release(self, upto: int) -> None:
        upto -= upto % self.mmap.PAGESIZE
        if self.map is not None and upto - self.released >= self.STEP:
            self.map.madvise(self.mmap.MADV_DONTNEED, self.released, upto - self.released)
            self.released = upto


def _digest(data: bytes | memoryview) -> str:
    h = new_hasher()
    h.update(data)
    return str(h.hexdigest())


def device_cuts(size: int) -> list[int]:
    """A device image's chunks: its header, then DEVICE_CHUNK pieces (the device's chunks, which
    follow the header back to back; an allocation's last one may be shorter, and the pieces after
    it then straddle two, which costs dedup across checkpoints only, never correctness)."""
    head = min(DEVICE_HEADER, size)
    return [head, *(min(DEVICE_CHUNK, size - off) for off in range(head, size, DEVICE_CHUNK))] if size else []


def cuts(runs: list[tuple[int, int]], size: int) -> list[int]:
    """The lengths of a page image's chunks: cut where the virtual address crosses a multiple of
    CHUNK_SIZE and where a run of pages ends (runs: (vaddr, bytes) from CRIU's pagemap, in file
    order), so that an area that grew, shrank or moved in the file still cuts the same chunks
    out of the memory it did not change. Fixed CHUNK_SIZE pieces when the runs do not account
    for the file."""
    if sum(n for _, n in runs) != size:
        return [min(CHUNK_SIZE, size - off) for off in range(0, size, CHUNK_SIZE)]
    out = []
    for vaddr, length in runs:
        end = vaddr + length
        while vaddr < end:
            step = min(end, (vaddr // CHUNK_SIZE + 1) * CHUNK_SIZE) - vaddr
            out.append(step)
            vaddr += step
    return out


# ---------------------------------------------------------------- restore, verify
# (packed.py decides whether a checkpoint needs these: most do not, and never load this module)

def check_chunks(root: Path, entries: Iterable[FileEntry], deep: bool) -> None:
    """Every chunk the entries reference is in the store (deep: and matches its digest)."""
    entries = list(entries)
    if not entries:
        return
    with Store(store_of(root)) as store:
        for entry in entries:
            chunks = chunks_of(entry)
            if sum(c.size for c in chunks) != entry.size:
                raise ImageInvalid(f"{entry.path}: its chunks do not add up to its size")
            whole = new_hasher()
            for c in chunks:
                if deep:
                    whole.update(store.read(c, entry.path))
                elif not store.has(c):
                    raise ImageInvalid(f"{entry.path}: chunk {c.digest} is missing from the store {store.path}")
            if deep and whole.hexdigest() != entry.checksum:
                raise ImageInvalid(f"{entry.path}: checksum mismatch (its chunks were altered)")


@contextlib.contextmanager
def reassembled(root: Path, packed: Sequence[FileEntry], sub: str) -> Iterator[Path]:
    """packed.assembled's view of root/sub when the entries in packed (all under sub) are in the
    store: a private directory in the store, those images written back from their chunks and
    links to the rest. Removed on exit."""
    import tempfile

    with Store(store_of(root)) as store:
        view = Path(tempfile.mkdtemp(prefix="restore-", dir=store.path))
        try:
            if (root / sub).is_dir():
                for name in os.listdir(root / sub):
                    os.symlink(root / sub / name, view / name)
            for entry in packed:
                rel = Path(*Path(entry.path).parts[1:])  # a set member's PID/devN.img keeps its PID/
                if len(rel.parts) > 1:
                    if (view / rel.parent).is_symlink():  # the member's directory: its own, not a link to it
                        os.unlink(view / rel.parent)
                        os.mkdir(view / rel.parent, 0o700)
                        for name in os.listdir(root / sub / rel.parent):
                            os.symlink(root / sub / rel.parent / name, view / rel.parent / name)
                    (view / rel.parent).mkdir(0o700, exist_ok=True)
                whole = new_hasher()
                fd = os.open(view / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
                with os.fdopen(fd, "wb") as f:
                    for c in chunks_of(entry):
                        data = store.read(c, entry.path)
                        whole.update(data)
                        f.write(data)
                if whole.hexdigest() != entry.checksum:
                    raise ImageInvalid(f"{entry.path}: checksum mismatch (its chunks were altered)")
            yield view
        finally:
            shutil.rmtree(view, ignore_errors=True)


# ---------------------------------------------------------------- prune: collect

def referenced(directory: Path, gone: Collection[str] = ()) -> set[str]:
    """Every chunk (HEX.CODEC) any manifest among directory's children (but those named in gone)
    references."""
    names: set[str] = set()
    for child in os.listdir(directory):
        root = directory / child
        if child == STORE_NAME or child in gone or root.is_symlink() or not (root / MANIFEST).is_file():
            continue
        try:
            m = load_manifest(root)
        except ImageInvalid:
            raise StorageProblem(f"cannot read {root / MANIFEST}; unreferenced chunks were not collected",
                                 "fix or remove that checkpoint, then prune again") from None
        for entry in packed_entries(m):
            names.update(c.name for c in chunks_of(entry))
    return names


def collect(directory: Path, dry_run: bool = False, gone: Collection[str] = ()) -> tuple[int, int]:
    """Delete the store's chunks no checkpoint in directory references: (chunks, bytes) freed
    (dry_run: would be, once the checkpoints named in gone are deleted too).
    A pack none of whose chunks is referenced goes; one at least half of whose bytes nothing
    references is rewritten with the rest (one less than half dead is left whole until then:
    a prune after each periodic checkpoint would otherwise rewrite most of the store each time,
    and the store stays within twice what is referenced); a pack without an index (a run that
    never finished) goes too, and so do the chunk files of a store written before packs that
    nothing references. Holds the store's lock exclusively: no checkpoint is adding or
    referencing chunks meanwhile."""
    path = directory.absolute() / STORE_NAME
    if not os.path.lexists(path):
        return 0, 0
    count = freed = 0
    with Store(path, exclusive=True) as store:
        keep = referenced(directory, gone)
        for pack, kinds in sorted(store.listing().items()):
            chunks = store.entries(pack) if "pack" in kinds else []
            live = [(digest, codec, at) for digest, codec, at in chunks if f"{digest}.{codec}" in keep]
            kept = sum(at.stored for _, _, at in live)
            # the pack's size: an adopted one holds bytes no index line covers (Store.adopt)
            total = os.stat(f"{pack}.pack", dir_fd=store.packs, follow_symlinks=False).st_size if "pack" in kinds else 0
            if kinds == {"pack", "idx"} and chunks and 2 * kept > total:
                continue  # all of it referenced, or most of it
            count += len(chunks) - len(live)
            if not dry_run:
                freed += store.drop(pack, live)
            else:
                freed += total - kept
        for sub, name in list(store.legacy_names()):
            if name not in keep:
                path = store.path / LEGACY / sub / name
                freed += os.lstat(path).st_size
                count += 1
                if not dry_run:
                    os.unlink(path)
    return count, freed
