"""The checkpoint directory: layout, typed manifest, checksums, atomic commit.

    DIR/manifest.yaml   written last; lists every image file with size and checksum
    DIR/criu/           CRIU images
    DIR/device/         device images written by a backend itself
    DIR/logs/           CRIU logs (not checksummed: diagnostics). Only regular files with the
                        names CRIU's runs write (LOG_NAMES) and restore-* subdirectories, each
                        created fresh and private by one restore, holding only such files.

A checkpoint is built under a temporary sibling name and renamed into place
only when complete, so a partial checkpoint never looks valid.

A process set (several independent trees checkpointed as one) keeps the same layout with one
subdirectory per member, named by its pid: DIR/criu/PID/, DIR/device/PID/, and its dump log
as logs/dump-PID.log; the manifest lists the members (format version 2, see SET_FORMAT_VERSION).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Optional, Sequence

from ..errors import ImageInvalid

FORMAT_VERSION = 1
MANIFEST = "manifest.yaml"
MANIFEST_CHECKSUM_KEY = "manifest_checksum"
SIGNATURE = "manifest.sig"  # optional, signing.py
CRIU_DIR = "criu"
DEVICE_DIR = "device"
LOG_DIR = "logs"
CHECKSUMMED_DIRS = (CRIU_DIR, DEVICE_DIR)
# What may sit in logs/ besides restore-* directories: dump's logs, and those of restores
# made before restores got their own directory. Never written through: see restore_log_dir.
LOG_NAMES = frozenset({"dump.log", "stats-dump", "restore.log", "stats-restore", "lazy-pages.log"})
MEMBER_LOG = re.compile(r"^(dump-[0-9]+\.log|stats-dump-[0-9]+)$")  # a set member's dump logs
RESTORE_LOG_DIR = re.compile(r"^restore-[A-Za-z0-9_]{8}$")
CHUNK = 8 << 20
# hash_fd's buffer for what it reads in one thread: small enough to stay in the CPU's cache, and to
# cost no page faults worth counting (a fresh 8 MiB buffer took 4 ms of a 15 MB image's 5 ms).
READ_CHUNK = 1 << 20

# Hidden siblings npusnap names itself: `.NAME.partial-*` (being written),
# `.NAME.old-*` (replaced by --replace), `.NAME.deleting-*` (being pruned).
HIDDEN_SIBLING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old|deleting)-(?P<token>[0-9a-f]{8})$")


def hidden_sibling(final: Path, kind: str) -> Path:
    return final.parent / f".{final.name}.{kind}-{os.urandom(4).hex()}"  # not secrets: it costs hmac's import


@dataclass
class FileEntry:
    """One file of a checkpoint: its path under DIR, size and checksum (or its chunks in the store)."""

    path: str
    size: int
    checksum: str
    chunks: list[str] = field(default_factory=list)  # packed into the chunk store (store.py): not in DIR


# What the chunk store may hold (store.py): CRIU's page images, and (--compress) direct device
# images (native/npusim/export.h); a set member's in its PID/.
PAGES = re.compile(r"criu/([0-9]+/)?pages-[0-9]+\.img")
DEVICE_IMAGE = re.compile(r"device/([0-9]+/)?dev[0-9]+\.img")
PACKABLE = re.compile(f"{PAGES.pattern}|{DEVICE_IMAGE.pattern}")


@dataclass
class ProcessEntry:
    """One process of the dumped tree."""

    pid: int
    ppid: int
    comm: str
    threads: int


@dataclass
class PhaseTiming:
    """One phase of a checkpoint or restore: its seconds, bytes and named steps."""

    name: str
    seconds: float
    bytes: int = 0

    def __post_init__(self) -> None:
        # The phase's steps (name -> {"seconds", "bytes"}), for profiling (`--json`, bench/): an
        # attribute, not a field, so that asdict() and with it the manifest never holds them.
        self.parts: dict[str, dict[str, float]] = {}

    def add_parts(self, parts: dict[str, tuple[float, int]]) -> None:
        """Steps of the phase as their performer timed them: name -> (seconds, bytes)."""
        for name, (seconds, nbytes) in parts.items():
            self.parts[name] = {"seconds": round(seconds, 6), "bytes": nbytes}


@dataclass
class DeviceState:
    """What a process held on its device(s) when it was checkpointed."""

    backend: str = "none"            # backends.BackendName: none | sim | ascend | cuda
    devices: list[int] = field(default_factory=list)
    allocations: int = 0
    bytes: int = 0
    method: str = "none"             # in-process: device memory staged in the process and dumped by CRIU
    runtime: Optional[str] = None
    endpoint: Optional[str] = None   # sim: the device daemon's socket the process uses
    gpus: list[str] = field(default_factory=list)  # cuda: UUIDs (GPU-...) of the checkpointed GPUs,
                                                   # in the order of `devices` (their driver ordinals)
    resources: dict[str, int] = field(default_factory=dict)  # sim: live resources of each kind
    referenced: int = 0              # direct, incremental: bytes of device chunks left in the parent chain


@dataclass
class ParentRef:
    """An incremental checkpoint's parent (image/chain.py): its directory relative to this one (the
    two move together), and its manifest's checksum line (a parent replaced since is refused)."""
    path: str
    manifest_checksum: str


@dataclass
class Manifest:
    """manifest.yaml: what a checkpoint holds; written last, before the rename that makes DIR valid."""

    pid: int
    created: str
    host: str
    kernel: str
    npusnap_version: str
    criu_version: str
    command: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    processes: list[ProcessEntry] = field(default_factory=list)
    device: DeviceState = field(default_factory=DeviceState)
    phases: list[PhaseTiming] = field(default_factory=list)
    files: list[FileEntry] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    members: list["MemberEntry"] = field(default_factory=list)  # a process set's; empty for one process
    parent: Optional[ParentRef] = None  # an incremental checkpoint's (its device images reference the parent's)

    def to_dict(self) -> dict[str, Any]:
        # The files by hand: asdict would copy each of their chunk lines (thousands with --dedup)
        # one by one. A file in DIR itself has no chunks key: listed exactly as it always was.
        d = dataclasses.asdict(dataclasses.replace(self, files=[]))
        d["files"] = [{"path": f.path, "size": f.size, "checksum": f.checksum}
                      | ({"chunks": list(f.chunks)} if f.chunks else {}) for f in self.files]
        if not self.members:
            del d["members"]  # a single process's manifest stays exactly what it always was
        if self.parent is None:
            del d["parent"]
        return d

    @property
    def is_set(self) -> bool:
        return bool(self.members)

    @classmethod
    def from_dict(cls, d: Any) -> "Manifest":
        if not isinstance(d, dict):
            raise ImageInvalid("manifest.yaml is not a mapping")
        try:
            _check_version(d)
            fields = {f.name for f in dataclasses.fields(cls)}
            kw = {k: v for k, v in d.items() if k in fields}
            kw["processes"] = [ProcessEntry(**p) for p in d.get("processes", [])]
            kw["device"] = DeviceState(**d.get("device", {}))
            kw["phases"] = [PhaseTiming(**p) for p in d.get("phases", [])]
            kw["files"] = [FileEntry(**f) for f in d.get("files", [])]
            kw["members"] = _members_from(d)
            parent = d.get("parent")
            if parent is not None:
                if not isinstance(parent, dict) or not all(isinstance(parent.get(k), str)
                                                           for k in ("path", "manifest_checksum")):
                    raise ValueError(f"parent is {parent!r}")
                kw["parent"] = ParentRef(parent["path"], parent["manifest_checksum"])
            m = cls(**kw)
        except (TypeError, ValueError, AttributeError) as e:
            raise ImageInvalid(f"manifest.yaml is malformed: {e}") from e
        m._check_types()
        _check_members(m)
        return m

    def _check_types(self) -> None:
        """Refuse values of the wrong type, so later code never trips on them."""
        def bad(what: str, value: Any) -> ImageInvalid:
            return ImageInvalid(f"manifest.yaml is malformed: {what} is {type(value).__name__} {value!r}")

        if not isinstance(self.pid, int) or isinstance(self.pid, bool):
            raise bad("pid", self.pid)
        for f in self.files:
            if not isinstance(f.path, str) or not isinstance(f.checksum, str):
                raise bad("a file's path or checksum", f.path)
            if not isinstance(f.size, int) or f.size < 0:
                raise bad(f"{f.path}'s size", f.size)
            if not isinstance(f.chunks, list) or (f.chunks and not PACKABLE.fullmatch(f.path)):
                raise bad(f"{f.path}'s chunks", f"{len(f.chunks)} chunks" if isinstance(f.chunks, list) else f.chunks)
        for p in self.processes:
            if not all(isinstance(v, int) for v in (p.pid, p.ppid, p.threads)):
                raise bad("a process entry", p)
        for ph in self.phases:
            if not isinstance(ph.seconds, (int, float)) or not isinstance(ph.bytes, int):
                raise bad("a phase timing", ph)
        dev = self.device
        if not isinstance(dev.backend, str) or not isinstance(dev.bytes, int) or not isinstance(dev.devices, list) \
                or not isinstance(dev.resources, dict):
            raise bad("the device section", dev)
        if not isinstance(self.options, dict) or not isinstance(self.command, list):
            raise bad("options or command", self.options)


def _size_mismatch(entry: FileEntry, size: int) -> ImageInvalid:
    return ImageInvalid(f"{entry.path}: size {size} differs from the manifest's {entry.size} (truncated or altered)")


def _check_version(d: dict[str, Any]) -> None:
    try:
        version = int(d.get("format_version", -1))
    except (TypeError, ValueError):
        raise ImageInvalid(f"manifest format version {d.get('format_version')!r} is not a number") from None
    if version > SET_FORMAT_VERSION:
        raise ImageInvalid(
            f"manifest format version {version} is newer than this npusnap understands ({SET_FORMAT_VERSION})",
            "upgrade npusnap to restore this checkpoint",
        )
    if version not in (FORMAT_VERSION, SET_FORMAT_VERSION):
        raise ImageInvalid(f"unsupported manifest format version {version}")


# ---------------------------------------------------------------- process sets
# A set's manifest: the top level describes the set as a whole (pid and command of its first
# member, every member's processes, the devices summed up, the set's phases, every file); each
# member has its own entry, and its files under criu/PID/ and device/PID/. Version 2, so that an
# npusnap that predates sets refuses it instead of restoring criu/ as one tree.

SET_FORMAT_VERSION = 2


@dataclass
class MemberEntry:
    """One member of a process set's checkpoint: its root pid, tree and device state."""

    pid: int
    command: list[str] = field(default_factory=list)
    processes: list[ProcessEntry] = field(default_factory=list)
    device: DeviceState = field(default_factory=DeviceState)
    phases: list[PhaseTiming] = field(default_factory=list)

    @property
    def subdir(self) -> str:
        return str(self.pid)

    def owns(self, entry: FileEntry) -> bool:
        parts = Path(entry.path).parts
        return len(parts) > 2 and parts[0] in CHECKSUMMED_DIRS and parts[1] == self.subdir

    def files(self, manifest: Manifest) -> list[FileEntry]:
        """This member's files, named as in a single checkpoint (criu/X, device/X)."""
        return [member_relative(f) for f in manifest.files if self.owns(f)]


def packable(path: str) -> bool:
    """Whether an image (its path in the checkpoint) is a page image, the kind the chunk store takes."""
    return bool(PAGES.fullmatch(path))


def packed_entries(manifest: Manifest) -> list[FileEntry]:
    """The manifest's images that live in the chunk store (listed with their chunks): image/packed.py."""
    return [f for f in manifest.files if f.chunks]


def member_relative(entry: FileEntry) -> FileEntry:
    """criu/PID/X -> criu/X: a member's file as its own pipeline names it."""
    parts = Path(entry.path).parts
    return FileEntry(str(Path(parts[0], *parts[2:])), entry.size, entry.checksum)


def in_member(entry: FileEntry, pid: int) -> FileEntry:
    """criu/X -> criu/PID/X: the inverse of member_relative."""
    parts = Path(entry.path).parts
    return FileEntry(str(Path(parts[0], str(pid), *parts[1:])), entry.size, entry.checksum)


def set_device(devices: Sequence[DeviceState]) -> DeviceState:
    """The set's device section: what its members hold, summed up."""
    def common(values: list[str]) -> str:
        return values[0] if len(set(values)) == 1 else "mixed"

    return DeviceState(backend=common([d.backend for d in devices]) if devices else "none",
                       devices=sorted({x for d in devices for x in d.devices}),
                       allocations=sum(d.allocations for d in devices), bytes=sum(d.bytes for d in devices),
                       method=common([d.method for d in devices]) if devices else "none",
                       gpus=list(dict.fromkeys(g for d in devices for g in d.gpus)),
                       referenced=sum(d.referenced for d in devices))  # incremental: left in the chain


def member_summary(m: Manifest, e: MemberEntry) -> dict[str, Any]:
    """One member as inspect, verify, list and checkpoint report it: its size, its files, one
    checksum over its files' checksums (equal sums: equal images), its device and phases."""
    files = [f for f in m.files if e.owns(f)]
    h = new_hasher()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{member_relative(f).path} {f.size} {f.checksum}\n".encode())
    return {"pid": e.pid, "command": list(e.command), "processes": len(e.processes),
            "files": len(files), "bytes": sum(f.size for f in files), "checksum": str(h.hexdigest()),
            "device": dataclasses.asdict(e.device), "phases": [dataclasses.asdict(p) for p in e.phases]}


def _members_from(d: dict[str, Any]) -> list[MemberEntry]:
    members = d.get("members", [])
    if not isinstance(members, list):
        raise TypeError("members is not a list")
    return [MemberEntry(pid=e["pid"], command=e.get("command", []),
                        processes=[ProcessEntry(**p) for p in e.get("processes", [])],
                        device=DeviceState(**e.get("device", {})),
                        phases=[PhaseTiming(**p) for p in e.get("phases", [])]) for e in members]


def _check_members(m: Manifest) -> None:
    """A set's manifest has version 2 and members with distinct pids, every file in one of
    them; a single process's has version 1 and no members."""
    def bad(why: str) -> ImageInvalid:
        return ImageInvalid(f"manifest.yaml is malformed: {why}")

    if (m.format_version == SET_FORMAT_VERSION) != m.is_set:
        raise bad(f"format version {m.format_version} with {len(m.members)} set members")
    pids = [e.pid for e in m.members]
    if not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids) or len(set(pids)) != len(pids):
        raise bad(f"set members {pids!r} are not distinct pids")
    for e in m.members:
        if not isinstance(e.command, list) or not all(isinstance(p.pid, int) for p in e.processes):
            raise bad(f"set member {e.pid}'s entry")
    for f in m.files if m.is_set else ():
        if not any(e.owns(f) for e in m.members):
            raise bad(f"{f.path} belongs to no set member")


def new_hasher() -> Any:
    import xxhash

    return xxhash.xxh3_128()


def checksum_file(path: Path) -> tuple[int, str]:
    """Size and checksum of a regular file, never following a symlink."""
    h = new_hasher()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ImageInvalid(f"{path} is not a regular file")
        size = hash_fd(fd, h)
    finally:
        os.close(fd)
    return size, h.hexdigest()


def hash_fd(fd: int, h: Any, offset: int = 0, end: Optional[int] = None) -> int:
    """Feed h the bytes of fd from offset to end (default: EOF); returns how many. The buffer is
    sized to the file up to READ_CHUNK (most images are a few KiB: a large buffer per file would
    cost more than hashing them), and xxhash releases the GIL while it hashes. A large range is read on a thread
    of its own while this one hashes what was read before (_hash_overlapped)."""
    if end is None:
        end = os.fstat(fd).st_size
    if end - offset > 2 * CHUNK:
        return _hash_overlapped(fd, h, offset, end)
    buf = bytearray(max(1, min(READ_CHUNK, end - offset)))
    view = memoryview(buf)
    done = 0
    while offset + done < end:
        n = os.preadv(fd, [view[:end - offset - done]], offset + done)
        if not n:
            break
        h.update(view[:n])
        done += n
    return done


def _hash_overlapped(fd: int, h: Any, offset: int, end: int) -> int:
    """hash_fd's large ranges: the copy out of the page cache (or the disk's read) and the hash,
    each about half of the work, run at once, on two buffers that take turns; the hash is fed in
    file order. A read error is raised here, once the reader has stopped."""
    import queue
    import threading

    free: "queue.Queue[bytearray]" = queue.Queue()
    full: "queue.Queue[tuple[Optional[bytearray], int, Optional[OSError]]]" = queue.Queue()
    for _ in range(2):
        free.put(bytearray(CHUNK))
    stop = threading.Event()

    def read() -> None:
        pos = offset
        try:
            while pos < end and not stop.is_set():
                buf = free.get()
                n = os.preadv(fd, [memoryview(buf)[:min(CHUNK, end - pos)]], pos)
                if not n:
                    break  # shorter than it was: what was read is what counts
                full.put((buf, n, None))
                pos += n
        except OSError as e:
            full.put((None, 0, e))
            return
        full.put((None, 0, None))

    reader = threading.Thread(target=read, name="image-reader", daemon=True)
    reader.start()
    done = 0
    try:
        while True:
            buf, n, err = full.get()
            if buf is None:
                if err is not None:
                    raise err
                return done
            h.update(memoryview(buf)[:n])
            done += n
            free.put(buf)
    finally:
        stop.set()
        free.put(bytearray(0))  # wakes a reader waiting for a buffer; it sees stop and ends
        reader.join()


def image_files(root: Path) -> Iterator[Path]:
    """Every file under the checksummed subdirectories, relative to root, sorted."""
    for sub in CHECKSUMMED_DIRS:
        base = root / sub
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                yield (Path(dirpath) / name).relative_to(root)


def safe_member(root: Path, rel: str) -> Path:
    """Resolve a manifest path inside root; refuse anything that could escape it."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] not in CHECKSUMMED_DIRS:
        raise ImageInvalid(f"manifest names a path outside the checkpoint: {rel!r}")
    cur = root
    for part in p.parts:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise ImageInvalid(f"{rel} is missing") from None
        if stat.S_ISLNK(st.st_mode):
            raise ImageInvalid(f"{rel} goes through a symlink; refusing to follow it")
    return cur


def load_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    if not root.is_dir():
        raise ImageInvalid(f"{root} is not a checkpoint directory (no such directory)")
    if path.is_symlink() or not path.is_file():
        raise ImageInvalid(f"{root} is not a checkpoint directory (no {MANIFEST})",
                           "a checkpoint whose manifest is missing is incomplete and cannot be restored")
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ImageInvalid(f"{path} is not valid YAML: " + " ".join(str(e).split())) from e
    data = _read_flow_lines(text)
    if data is None:  # block-style YAML: written by an older npusnap, or edited
        import yaml

        try:
            data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml's: ~10x faster
        except yaml.YAMLError as e:
            raise ImageInvalid(f"{path} is not valid YAML: " + " ".join(str(e).split())) from e
    if isinstance(data, dict):
        _check_version(data)
        _checked_body(text)
        data.pop(MANIFEST_CHECKSUM_KEY, None)
    return Manifest.from_dict(data)


# A manifest is written as YAML whose every top-level value is one line of JSON (a flow value:
# YAML reads it as the same data), so that it is read back with json, in a fraction of the time
# PyYAML's import alone takes, and any YAML reader still reads it.
_FLOW_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _read_flow_lines(text: str) -> Optional[dict[str, Any]]:
    """The manifest's mapping when each of its lines is `key: JSON` (the checksum line's value
    is taken as text); None for anything else, which YAML then reads."""
    import json

    data: dict[str, Any] = {}
    for line in text.rstrip("\n").split("\n"):  # "\n" only: flow_yaml's JSON escapes every other break
        key, sep, value = line.partition(": ")
        if not sep or not _FLOW_KEY.fullmatch(key):
            return None
        if key == MANIFEST_CHECKSUM_KEY:
            data[key] = value.strip()
            continue
        try:
            data[key] = json.loads(value)
        except ValueError:
            return None
    return data


def flow_yaml(data: dict[str, Any]) -> str:
    """A mapping as YAML lines `key: JSON`, in ASCII (JSON's escapes). Floats always carry a
    decimal point (1.0e-05): YAML 1.1 readers (PyYAML) take a bare 1e-05 for a string."""
    import json

    def value(v: Any) -> str:
        if isinstance(v, float) and not isinstance(v, bool):
            r = json.dumps(v, allow_nan=False)  # ValueError for nan/inf: a manifest never holds them
            mantissa, e, exp = r.partition("e")
            return f"{mantissa}.0{e}{exp}" if e and "." not in mantissa else r
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):  # JSON's keys are text: 1 would come back as "1"
                raise TypeError(f"a manifest mapping with keys that are not text: {list(v)!r}")
            return "{" + ", ".join(f"{json.dumps(k)}: {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            if all(isinstance(x, str) for x in v):  # chunk lines: the same text, in one call
                return json.dumps(v)
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v, allow_nan=False)

    for k in data:
        if not _FLOW_KEY.fullmatch(k):
            raise ValueError(f"not a manifest key: {k!r}")
    return "".join(f"{k}: {value(v)}\n" for k, v in data.items())


def manifest_text(data: dict[str, Any]) -> str:
    """A manifest's file content: the YAML (flow_yaml), then a checksum line covering it."""
    return seal_manifest_text(flow_yaml(data))


def seal_manifest_text(body: str) -> str:
    """Append the checksum line to a manifest's YAML (dropping a stale one)."""
    lines = [line for line in body.splitlines() if not line.startswith(f"{MANIFEST_CHECKSUM_KEY}:")]
    body = "\n".join(lines) + "\n"
    return f"{body}{MANIFEST_CHECKSUM_KEY}: {_text_digest(body)}\n"


def _checked_body(text: str) -> str:
    """The manifest's YAML without its last line, `manifest_checksum: HEX`, which must
    match the rest: an edit anywhere in the manifest is caught, not just in the file list."""
    body, _, last = text.rstrip("\n").rpartition("\n")
    key, _, digest = last.partition(":")
    if key != MANIFEST_CHECKSUM_KEY:
        raise ImageInvalid(f"{MANIFEST} has no {MANIFEST_CHECKSUM_KEY} line (incomplete or edited)")
    body += "\n"
    if _text_digest(body) != digest.strip():
        raise ImageInvalid(f"{MANIFEST} was edited or corrupted (its checksum does not match)")
    return body


def _text_digest(text: str) -> str:
    h = new_hasher()
    h.update(text.encode())
    return str(h.hexdigest())


def verify(root: Path, manifest: Optional[Manifest] = None, shallow: Sequence[str] = (),
           later: Collection[str] = (), chunks_checked: bool = False) -> Manifest:
    """Check every listed file's size and checksum, and that nothing unlisted was added.
    Files under the `shallow` subdirectories, and the files named in `later`, get their size
    checked only (their reader verifies their checksums while it reads them: check_entry).
    Files packed into the chunk store are packed.verify's (which calls this, chunks_checked)."""
    m = manifest or load_manifest(root)
    listed = set()
    if not chunks_checked and any(e.chunks for e in m.files):
        raise ImageInvalid(f"{root}'s host pages are in the chunk store: verify it with image.packed.verify")
    for entry in m.files:
        if entry.chunks:
            listed.add(entry.path)
            continue
        path = safe_member(root, entry.path)
        listed.add(entry.path)
        if Path(entry.path).parts[0] in shallow or entry.path in later:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
                raise _size_mismatch(entry, st.st_size)
            continue
        check_entry(path, entry)
    for rel in image_files(root):
        if str(rel) not in listed:
            raise ImageInvalid(f"{rel} is not listed in the manifest (added after the checkpoint)")
    check_tree(root)
    return m


def check_entry(path: Path, entry: FileEntry) -> None:
    """One file against its manifest entry: size and checksum."""
    size, digest = checksum_file(path)
    if size != entry.size:
        raise _size_mismatch(entry, size)
    if digest != entry.checksum:
        raise ImageInvalid(f"{entry.path}: checksum mismatch (the file was altered or corrupted)")


def check_tree(root: Path) -> None:
    """Refuse a link or an unexpected file anywhere in the directory, logs/ included: the
    top level holds only the manifest (and its signature) and the three subdirectories; criu/ and device/ only
    directories and regular files (their listing is checked against the manifest); logs/
    only LOG_NAMES and restore-* directories of LOG_NAMES. Every file must be regular."""
    def bad(rel: str, what: str) -> ImageInvalid:
        return ImageInvalid(f"{rel} {what}; refusing the directory (planted or tampered with?)",
                            "remove it if you know where it came from, or restore from a trusted copy")

    def kind(path: Path, rel: str) -> int:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise bad(rel, "is a symbolic link")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise bad(rel, "is not a regular file")
        if stat.S_ISREG(mode) and os.lstat(path).st_nlink > 1:
            raise bad(rel, "has other hard links")
        return mode

    for name in sorted(os.listdir(root)):
        mode = kind(root / name, name)
        if name in (MANIFEST, SIGNATURE) and stat.S_ISREG(mode):
            continue
        if name not in (*CHECKSUMMED_DIRS, LOG_DIR) or not stat.S_ISDIR(mode):
            raise bad(name, "is not part of a checkpoint")
        if name == LOG_DIR:
            _check_logs(root / LOG_DIR, kind, bad)
            continue
        for dirpath, dirnames, filenames in os.walk(root / name):
            for n in dirnames + filenames:
                p = Path(dirpath) / n
                kind(p, str(p.relative_to(root)))


def _check_logs(logs: Path, kind: Any, bad: Any) -> None:
    for name in sorted(os.listdir(logs)):
        rel = f"{LOG_DIR}/{name}"
        mode = kind(logs / name, rel)
        if stat.S_ISREG(mode) and (name in LOG_NAMES or MEMBER_LOG.match(name)):
            continue
        if not (stat.S_ISDIR(mode) and RESTORE_LOG_DIR.match(name)):
            raise bad(rel, "is not a log npusnap writes")
        for inner in sorted(os.listdir(logs / name)):
            if not stat.S_ISREG(kind(logs / name / inner, f"{rel}/{inner}")) or inner not in LOG_NAMES:
                raise bad(f"{rel}/{inner}", "is not a log npusnap writes")


def restore_log_dir(root: Path) -> Path:
    """A fresh private directory for one restore's CRIU logs, DIR/logs/restore-XXXXXXXX: CRIU
    opens its log by name and follows links, so it only ever writes inside a directory made
    just now. logs/ itself must be a real directory (not a link) of ours."""
    logs = root / LOG_DIR
    st = os.lstat(logs)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ImageInvalid(f"{logs} is not a directory of ours; refusing to write logs there")
    while True:  # tempfile.mkdtemp's way, without its import (random, shutil) on every restore
        path = logs / f"restore-{os.urandom(4).hex()}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
