"""The chunk store: CRIU's page images (and, with --compress, direct device images) kept as
content-addressed chunks, each stored once.

    PARENT/.npusnap-store/          beside the checkpoints (0700, ours, never a link)
        lock                        flock: shared while a checkpoint adds or references chunks,
                                    exclusive while prune collects the unreferenced ones
        chunks/AB/HEX.CODEC         one chunk: its xxh3-128 (of the raw bytes) names it; CODEC is
                                    how it is stored (raw | zstd | lz4)

A packed image is listed in the manifest with its size and checksum as before, plus its
chunks ("HEX CODEC SIZE STORED" each, in order); the file itself is not in the checkpoint.
An unchanged page range costs nothing the second time: its chunk is already there. Restore
reassembles the file for CRIU, checking each chunk's digest and the whole file's checksum.

The store is shared by the checkpoints of one directory only, so that `prune DIR` sees every
manifest that may reference a chunk before it deletes one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Optional, Sequence

from ..errors import ImageInvalid, StorageProblem
from . import format as fmt
from .checksums import fsync_all
from .format import CRIU_DIR, DEVICE_IMAGE, MANIFEST, PAGES, FileEntry, Manifest, load_manifest, new_hasher

STORE_NAME = ".npusnap-store"
CHUNK_SIZE = 64 << 10  # page-aligned; small enough that a changed page rewrites little
_STORED = {"none": "raw", "zstd": "zstd", "lz4": "lz4"}
_NAME = re.compile(r"^([0-9a-f]{32})\.(raw|zstd|lz4)$")
PAGE_IMAGE = re.compile(r"pages-[0-9]+\.img")  # CRIU's page images, the ones packed
DEVICE_HEADER = 64  # cut off first, so that the device's chunks fall on our chunk boundaries
# A device image's chunk: the daemon's own (it tracks changes per MiB), and one file (fsync'd) per
# MiB instead of 16.
DEVICE_CHUNK = 1 << 20
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Chunk:
    digest: str
    codec: str   # raw | zstd | lz4
    size: int    # raw bytes
    stored: int  # bytes in the store

    def text(self) -> str:
        return f"{self.digest} {self.codec} {self.size} {self.stored}"

    @classmethod
    def parse(cls, text: Any, where: str) -> "Chunk":
        parts = text.split() if isinstance(text, str) else []
        if len(parts) != 4 or not _NAME.match(f"{parts[0]}.{parts[1]}") or not all(p.isdigit() for p in parts[2:]):
            raise ImageInvalid(f"manifest.yaml is malformed: {where} lists a chunk {text!r}")
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))

    @property
    def rel(self) -> str:
        return f"chunks/{self.digest[:2]}/{self.digest}.{self.codec}"


def chunks_of(entry: FileEntry) -> list[Chunk]:
    return [Chunk.parse(c, entry.path) for c in entry.chunks]


def store_of(root: Path) -> Path:
    return root.absolute().parent / STORE_NAME


# ---------------------------------------------------------------- codecs

def _compress(codec: str, data: bytes) -> bytes:
    if codec == "zstd":
        import zstandard

        return bytes(zstandard.ZstdCompressor(level=1).compress(data))
    if codec == "lz4":
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    return data


def _decompress(codec: str, data: bytes, size: int) -> bytes:
    if codec == "zstd":
        import zstandard

        return bytes(zstandard.ZstdDecompressor().decompress(data, max_output_size=size))
    if codec == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(data))
    return data


class Chooser:
    """--compress auto: compress only while it does not make writing slower. The first chunks
    are written raw and timed to the disk (fsync'd together, as the seal does), and a sample of
    them compressed by each codec on the side; a codec is taken only if compressing plus writing
    what it leaves beats writing raw (we write one chunk after the other, so the costs add). Its
    compress rate is watched on: should it fall, the rest is written raw."""

    PROBE = 64 * CHUNK_SIZE  # 4 MiB: long enough to see through a busy machine, short against a checkpoint

    def __init__(self, choice: str) -> None:
        self.fixed = None if choice == "auto" else _STORED[choice]
        self.codec = "raw"
        self.seen = 0
        self.write_s = self.written = self.sampled = 0.0
        self.trial: dict[str, list[float]] = {"zstd": [0.0, 0.0], "lz4": [0.0, 0.0]}  # seconds, stored bytes
        self.spent = self.fed = 0.0
        self.ratio = 1.0

    def probing(self) -> bool:
        return self.fixed is None and self.written < self.PROBE

    def pick(self) -> str:
        return self.fixed if self.fixed is not None else self.codec

    def probe(self, data: bytes, write: Callable[[], None], sync: Callable[[], None]) -> None:
        if self.seen % 4 == 0:  # a sample of the probe's chunks: the trial itself must cost little
            for codec, acc in self.trial.items():
                t = time.perf_counter()
                acc[1] += len(_compress(codec, data))
                acc[0] += time.perf_counter() - t
            self.sampled += len(data)
        t = time.perf_counter()
        write()
        self.write_s += time.perf_counter() - t
        self.written += len(data)
        self.seen += 1
        if self.written >= self.PROBE:
            t = time.perf_counter()
            sync()  # as the seal does: the probe's chunks fsync'd together
            self.write_s += time.perf_counter() - t
            per_byte_w = self.write_s / max(self.written, 1)
            best, cost = "raw", per_byte_w
            for codec, (secs, stored) in self.trial.items():
                ratio = stored / max(self.sampled, 1)
                c = secs / max(self.sampled, 1) + ratio * per_byte_w
                if c < cost * 0.8:  # a margin: never slower
                    best, cost, self.ratio = codec, c, ratio
            self.codec = best
            self.per_byte_w = per_byte_w

    def timed(self, data: bytes) -> bytes:
        """Compress with the chosen codec; under auto, give up on it when it no longer pays."""
        codec = self.pick()
        if codec == "raw":
            return data
        t = time.perf_counter()
        out = _compress(codec, data)
        if self.fixed is None:
            self.spent += time.perf_counter() - t
            self.fed += len(data)
            if self.fed >= 64 * CHUNK_SIZE and self.spent / self.fed > (1 - self.ratio) * self.per_byte_w:
                self.codec = "raw"
        return out


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


class Store:
    """An open chunk store. Context manager: holds the store's lock (shared, or exclusive for
    collect) until closed."""

    def __init__(self, path: Path, create: bool = False, exclusive: bool = False) -> None:
        self.path = path
        self.fd = _own_dir(path, create)
        try:
            self.lock = os.open("lock", os.O_RDWR | os.O_CREAT | _OPEN, 0o600, dir_fd=self.fd)
            _flock(self.lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, path)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir("chunks", 0o700, dir_fd=self.fd)
            self.chunks = os.open("chunks", os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=self.fd)
        except FileNotFoundError:
            self.close()
            raise ImageInvalid(f"the chunk store {path} has no chunks") from None
        except OSError as e:
            self.close()
            raise StorageProblem(f"cannot open the chunk store {path}: {e.strerror}") from e
        except BaseException:
            self.close()
            raise
        self.written: list[tuple[str, str]] = []  # (fan-out dir, name) of chunks this run added
        self.fans: dict[str, int] = {}
        self.names_known: Optional[set[str]] = None  # index()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for fd in getattr(self, "fans", {}).values():
            os.close(fd)
        self.fans = {}
        for name in ("chunks", "lock", "fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                os.close(fd)
            setattr(self, name, -1)

    def _fan(self, digest: str, create: bool) -> int:
        """The fan-out directory of a digest, opened once (kept until close)."""
        sub = digest[:2]
        fd = self.fans.get(sub)
        if fd is None:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(sub, 0o700, dir_fd=self.chunks)
            fd = self.fans[sub] = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=self.chunks)
        return fd

    def index(self) -> None:
        """List the store once: find() then answers from memory (a checkpoint holds the lock,
        so nothing it lists goes away, and only it adds what it adds)."""
        self.names_known = {name for _, name in self.names()}

    def find(self, digest: str) -> Optional[Chunk]:
        """A chunk with these raw bytes already stored (any codec), or None."""
        for codec in ("zstd", "lz4", "raw"):
            name = f"{digest}.{codec}"
            if self.names_known is not None and name not in self.names_known:
                continue
            try:
                st = os.stat(name, dir_fd=self._fan(digest, create=False), follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                return Chunk(digest, codec, -1, st.st_size)
        return None

    def put(self, digest: str, codec: str, data: bytes) -> None:
        """Store one chunk under its name, atomically (a temporary file renamed into place)."""
        fan = self._fan(digest, create=True)
        tmp = f".tmp-{os.getpid()}-{os.urandom(4).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600, dir_fd=fan)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, f"{digest}.{codec}", src_dir_fd=fan, dst_dir_fd=fan)
        self.written.append((digest[:2], f"{digest}.{codec}"))
        if self.names_known is not None:
            self.names_known.add(f"{digest}.{codec}")

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

    def _stored(self, chunk: Chunk, where: str) -> bytes:
        try:
            fd = os.open(f"{chunk.digest}.{chunk.codec}", os.O_RDONLY | _OPEN, dir_fd=self._fan(chunk.digest, False))
        except FileNotFoundError:
            raise ImageInvalid(f"{where}: chunk {chunk.digest} is missing from the store {self.path}",
                               "it was deleted by hand or the store is incomplete; restore from a backup") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ImageInvalid(f"{where}: chunk {chunk.digest} in {self.path} is not a regular file")
            with os.fdopen(os.dup(fd), "rb") as f:
                stored = f.read(chunk.stored + 1)
        finally:
            os.close(fd)
        return stored

    def _checked(self, chunk: Chunk, stored: bytes, where: str) -> bytes:
        try:
            data = _decompress(chunk.codec, stored, chunk.size) if len(stored) == chunk.stored else b""
        except Exception:
            data = b""
        h = new_hasher()
        h.update(data)
        if len(data) != chunk.size or h.hexdigest() != chunk.digest:
            raise ImageInvalid(f"{where}: chunk {chunk.digest} is corrupt (its bytes do not match their digest)",
                               "restore the store from a backup")
        return data

    def to_sync(self) -> list[Path]:
        """The chunks this run added, and their directories: for the seal's one batch of fsyncs."""
        base = self.path / "chunks"
        return [*(base / d / n for d, n in self.written), *sorted({base / d for d, _ in self.written}), base, self.path]

    def names(self) -> Iterator[tuple[str, str]]:
        """(fan-out dir, name) of every file under chunks/."""
        for sub in sorted(os.listdir(self.chunks)):
            if re.fullmatch(r"[0-9a-f]{2}", sub):
                fan = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=self.chunks)
                try:
                    names = os.listdir(fan)
                finally:
                    os.close(fan)
                for name in sorted(names):
                    yield sub, name

    def remove(self, sub: str, name: str) -> int:
        fan = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | _OPEN, dir_fd=self.chunks)
        try:
            size = os.stat(name, dir_fd=fan, follow_symlinks=False).st_size
            os.unlink(name, dir_fd=fan)
        finally:
            os.close(fan)
        return size


# ---------------------------------------------------------------- checkpoint: pack

@dataclass
class PackStats:
    raw_bytes: int = 0         # the images' size
    new_bytes: int = 0         # what this checkpoint added to the store
    referenced_bytes: int = 0  # raw bytes of chunks that were there already
    codec: str = "raw"
    plain_bytes: int = 0       # device images auto left as files in DIR (compressing did not pay)

    def recorded(self, choice: str) -> dict[str, Any]:
        return {"store": STORE_NAME, "compress": choice, "codec": self.codec, "raw_bytes": self.raw_bytes,
                "new_bytes": self.new_bytes, "referenced_bytes": self.referenced_bytes,
                **({"plain_bytes": self.plain_bytes} if self.plain_bytes else {})}


class _NotCompressing(Exception):
    pass


class Packer:
    """Moves a checkpoint's page images (and device images) into the store. Its lock (shared) is held from the first
    chunk until close(), after the commit: prune cannot collect a chunk this checkpoint found
    in the store before its manifest says so."""

    @staticmethod
    def packs(entry: FileEntry) -> bool:
        """Whether an image goes to the store (CRIU's page images): packable()."""
        return packable(entry)

    def __init__(self, final: Path, choice: str) -> None:
        self.choice = choice
        self.runs: dict[str, list[tuple[int, int]]] = {}  # a page image's path -> its runs of pages (cuts)
        self.store = Store(store_of(final), create=True)
        self.store.index()
        self.chooser = Chooser(choice)
        self.stats = PackStats()         # host pages
        self.device_stats = PackStats()  # device images

    def close(self) -> None:
        self.store.close()

    def compressing(self) -> bool:
        """Whether images still go into the store compressed: a codec chosen, or auto still
        probing (it writes raw then, timed), or chose one."""
        return self.chooser.pick() != "raw" or self.chooser.probing()

    def add_runs(self, criu_dir: Path, runs: dict[str, list[tuple[int, int]]]) -> None:
        """The runs of pages of criu_dir's page images (platform/criu.page_runs), by image name."""
        self.runs.update({str(criu_dir / name): r for name, r in runs.items()})

    def try_pack(self, path: Path, entry: FileEntry) -> Optional[FileEntry]:
        """A device image staged in memory: packed (and kept there), or None as soon as auto finds
        that compressing does not pay (the caller then writes the file as it is: cheaper than raw
        chunks; what the probe stored stays for prune to collect)."""
        try:
            return self.pack(path, entry, keep=True, give_up=True)
        except _NotCompressing:
            return None

    def pack(self, path: Path, entry: FileEntry, keep: bool = False, give_up: bool = False) -> FileEntry:
        """Store the file's chunks (checking the whole checksum on the way), then remove it
        (keep: the caller still needs it, as a device image imported back for --leave-running)."""
        chunks = []
        whole = new_hasher()
        device = bool(DEVICE_IMAGE.fullmatch(entry.path))
        stats = self.device_stats if device else self.stats
        lengths = device_cuts(entry.size) if device else cuts(self.runs.get(str(path), []), entry.size)
        fd = os.open(path, os.O_RDONLY | _OPEN)
        try:
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                for length in lengths:
                    data = f.read(length)
                    whole.update(data)
                    chunks.append(self._one(data, stats))
                    if len(data) < length:
                        break
                    if give_up and not self.compressing():
                        raise _NotCompressing()
        finally:
            os.close(fd)
        size = sum(c.size for c in chunks)
        if size != entry.size or whole.hexdigest() != entry.checksum:
            raise ImageInvalid(f"{entry.path} changed while it was moved into the chunk store")
        if not keep:
            os.unlink(path)
        stats.raw_bytes += size
        stats.codec = self.chooser.pick() if not self.chooser.probing() else "raw"
        return FileEntry(entry.path, entry.size, entry.checksum, [c.text() for c in chunks])

    def _one(self, data: bytes, stats: PackStats) -> Chunk:
        h = new_hasher()
        h.update(data)
        digest = h.hexdigest()
        found = self.store.find(digest)
        if found is not None:
            stats.referenced_bytes += len(data)
            return Chunk(digest, found.codec, len(data), found.stored)
        if self.chooser.probing():
            self.chooser.probe(data, lambda: self.store.put(digest, "raw", data),
                               lambda: fsync_all(self.store.to_sync()[:-2]))
            stored, codec = data, "raw"
        else:
            codec = self.chooser.pick()
            stored = self.chooser.timed(data)
            codec = codec if stored is not data else "raw"
            if len(stored) >= len(data):
                stored, codec = data, "raw"  # incompressible: stored as it is
            self.store.put(digest, codec, stored)
        stats.new_bytes += len(stored)
        return Chunk(digest, codec, len(data), len(stored))


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


def packable(entry: FileEntry) -> bool:
    return bool(PAGES.fullmatch(entry.path))


def packed_device(manifest: Manifest) -> bool:
    """Whether the checkpoint's device images live in the chunk store (--compress)."""
    return any(f.chunks and DEVICE_IMAGE.fullmatch(f.path) for f in manifest.files)


# ---------------------------------------------------------------- restore, verify

def packed_entries(manifest: Manifest) -> list[FileEntry]:
    return [f for f in manifest.files if f.chunks]


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
                elif store.find(c.digest) is None:
                    raise ImageInvalid(f"{entry.path}: chunk {c.digest} is missing from the store {store.path}")
            if deep and whole.hexdigest() != entry.checksum:
                raise ImageInvalid(f"{entry.path}: checksum mismatch (its chunks were altered)")


def verify(root: Path, manifest: Optional[Manifest] = None, shallow: Sequence[str] = (),
           later: Collection[str] = (), deep: bool = True) -> Manifest:
    """format.verify, and the chunks of packed images: present (deep: and intact, each chunk's
    raw bytes against its digest and the whole image against its checksum)."""
    m = manifest or load_manifest(root)
    check_chunks(root, packed_entries(m), deep)
    return fmt.verify(root, m, shallow, later, chunks_checked=True)


@contextlib.contextmanager
def assembled(root: Path, manifest: Manifest, sub: str = CRIU_DIR, member: str = "") -> Iterator[Path]:
    """The directory CRIU (sub criu/) or the device import (sub device/) reads: root/sub itself,
    or, when images in it were packed, a private directory in the store holding them reassembled
    (every chunk checked, and the whole file's checksum) and links to the other (verified)
    images. Removed on exit. member: a set member's subdirectory, the only one reassembled."""
    packed = [e for e in packed_entries(manifest)
              if Path(e.path).parts[0] == sub and (not member or Path(e.path).parts[1] == member)]
    if not packed:
        yield root / sub
        return
    import tempfile  # only here: every restore imports this module

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

def referenced(directory: Path) -> set[str]:
    """Every chunk file name any manifest among directory's children references."""
    names: set[str] = set()
    for child in os.listdir(directory):
        root = directory / child
        if child == STORE_NAME or root.is_symlink() or not (root / MANIFEST).is_file():
            continue
        try:
            m = load_manifest(root)
        except ImageInvalid:
            raise StorageProblem(f"cannot read {root / MANIFEST}; unreferenced chunks were not collected",
                                 "fix or remove that checkpoint, then prune again") from None
        for entry in packed_entries(m):
            names.update(f"{c.digest}.{c.codec}" for c in chunks_of(entry))
    return names


def collect(directory: Path, dry_run: bool = False) -> tuple[int, int]:
    """Delete the store's chunks no checkpoint in directory references: (chunks, bytes) freed.
    Holds the store's lock exclusively: no checkpoint is adding or referencing chunks meanwhile."""
    path = directory.absolute() / STORE_NAME
    if not os.path.lexists(path):
        return 0, 0
    count = freed = 0
    with Store(path, exclusive=True) as store:
        keep = referenced(directory)
        for sub, name in list(store.names()):
            if name in keep:
                continue
            if dry_run:
                fan = store.path / "chunks" / sub / name
                freed += os.lstat(fan).st_size
            else:
                freed += store.remove(sub, name)
            count += 1
    return count, freed
