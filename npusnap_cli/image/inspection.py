"""What a checkpoint directory holds, as one typed model.

`inspect(root)` reads the manifest and CRIU's images (with pycriu) and returns an
`Inspection`; `npusnap inspect` renders it as a rich tree or, with `--json`, as
`dataclasses.asdict` of the very same object.

Reading only: nothing from the directory is executed, only files the manifest
lists are opened, and every one of them is reached through `image.safe_member`
and opened with O_NOFOLLOW, so a symlink planted in the directory is refused
rather than followed. Page contents (pages-*.img) are never decoded: memory sizes
come from the pagemap entries (pages x page size).

Images CRIU writes only for some workloads (sockets, files, threads) are optional:
when one is absent its section is simply empty. An image that is listed but
cannot be decoded makes the whole inspection fail with ImageInvalid.
"""

from __future__ import annotations

import bisect
import dataclasses
import mmap
import os
import quopri
import socket
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import EnvironmentProblem, ImageInvalid
from .format import CRIU_DIR, DEVICE_DIR, DeviceState, Manifest, load_manifest, member_summary, safe_member

# CRIU's VMA status bits (criu/include/image.h) and the mmap flags we look at.
VMA_AREA_STACK = 1 << 1
VMA_AREA_VSYSCALL = 1 << 2
VMA_AREA_VDSO = 1 << 3
VMA_AREA_HEAP = 1 << 5
VMA_FILE_PRIVATE = 1 << 6
VMA_FILE_SHARED = 1 << 7
VMA_ANON_SHARED = 1 << 8
VMA_ANON_PRIVATE = 1 << 9
VMA_AREA_SYSVIPC = 1 << 10
VMA_AREA_VVAR = 1 << 12
VMA_AREA_MEMFD = 1 << 14
VMA_AREA_SHSTK = 1 << 15
MAP_GROWSDOWN = 0x100

# Pagemap entry flags: where an entry's pages are.
PE_PARENT = 1 << 0
PE_PRESENT = 1 << 2

# Memory kinds, in display order.
MEMORY_KINDS = ("anonymous", "heap", "stack", "file", "shared", "other")

TASK_STATES = {1: "alive", 3: "zombie", 6: "stopped"}
ACCESS = {os.O_RDONLY: "r", os.O_WRONLY: "w", os.O_RDWR: "rw"}


# ---------------------------------------------------------------- the model


@dataclass
class ThreadInfo:
    tid: int
    comm: str


@dataclass
class MemoryKind:
    kind: str          # anonymous | heap | stack | file | shared | other
    vmas: int          # mappings of this kind
    mapped: int        # their virtual size, bytes
    dumped: int        # bytes of their pages stored in this checkpoint


@dataclass
class MemoryInfo:
    page_size: int
    vmas: int
    mapped: int
    dumped: int        # pages stored in this checkpoint's pages-*.img
    in_parent: int     # pages left in a parent checkpoint (incremental dumps)
    kinds: list[MemoryKind] = field(default_factory=list)


@dataclass
class OpenFile:
    fd: int
    type: str          # reg, pipe, fifo, eventfd, tty, memfd, ... (CRIU's file type, lower case)
    path: str          # the file's path for reg/fifo; a description for others
    access: str = ""   # r | w | rw, where CRIU records it


@dataclass
class SocketInfo:
    fd: int
    family: str        # unix | inet | inet6 | netlink | packet
    type: str          # stream | dgram | seqpacket | raw | ...
    state: str         # listen | established | close | ...
    local: str         # path (unix; "@name" when abstract) or address:port
    peer: str = ""     # peer path / address:port, when connected


@dataclass
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    comm: str
    state: str
    command: list[str] = field(default_factory=list)   # known for the root process only
    exe: str = ""
    cwd: str = ""
    threads: list[ThreadInfo] = field(default_factory=list)
    memory: Optional[MemoryInfo] = None
    files: list[OpenFile] = field(default_factory=list)
    sockets: list[SocketInfo] = field(default_factory=list)


@dataclass
class ImageFile:
    path: str
    size: int


@dataclass
class ImageSizes:
    total: int
    by_directory: dict[str, int] = field(default_factory=dict)
    files: list[ImageFile] = field(default_factory=list)


@dataclass
class ChainInfo:
    """Incremental checkpoints (image/chain.py): where the device data lies."""
    parent: Optional[str]   # the parent checkpoint's directory; None for a full checkpoint
    device_new: int         # bytes of this checkpoint's own device images
    device_referenced: int  # bytes of device chunks left in the parent chain


@dataclass
class PhaseInfo:
    name: str
    seconds: float
    bytes: int
    throughput: Optional[float] = None   # bytes per second, when the phase moved bytes


@dataclass
class Inspection:
    directory: str
    format_version: int
    created: str
    host: str
    kernel: str
    npusnap_version: str
    criu_version: str
    pid: int
    command: list[str]
    options: dict[str, Any]
    processes: list[ProcessInfo]
    memory_dumped: int
    device: DeviceState
    phases: list[PhaseInfo]
    images: ImageSizes
    notes: list[str] = field(default_factory=list)
    members: list[dict[str, Any]] = field(default_factory=list)  # a process set's: format.member_summary
    chain: ChainInfo = field(default_factory=lambda: ChainInfo(None, 0, 0))
    host_pages: Optional[dict[str, Any]] = None  # --dedup: page images in the chunk store, bytes new vs referenced
    device_images: Optional[dict[str, Any]] = None  # --compress: device images in the chunk store, raw vs stored

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- reading


def inspect(root: Path) -> Inspection:
    """Read DIR's manifest and CRIU images into an Inspection (reads only)."""
    manifest = load_manifest(root)
    ins = _from_manifest(root, manifest)
    # One process tree per CRIU image directory: a set's members each have their own.
    trees = [(manifest, CRIU_DIR)]
    if manifest.is_set:
        trees = [(dataclasses.replace(manifest, pid=e.pid, command=e.command, processes=e.processes),
                  f"{CRIU_DIR}/{e.subdir}") for e in manifest.members]
        ins.members = [member_summary(manifest, e) for e in manifest.members]
    page_size = mmap.PAGESIZE
    for tree_manifest, criu_dir in trees:
        reader = _ImageReader(root, manifest, criu_dir)
        procs = _processes(reader, tree_manifest, ins.notes)
        for proc in procs:
            proc.memory = _memory(reader, proc.pid, page_size)
            proc.files, proc.sockets = _fds(reader, proc.pid, _files_id(reader, proc.pid))
            proc.cwd = _cwd(reader, proc.pid)
            proc.exe = reader.exe_name(proc.pid)
        ins.processes += procs

    ins.memory_dumped = sum(p.memory.dumped for p in ins.processes if p.memory is not None)
    pages_on_disk = sum(f.size for f in ins.images.files
                        if str(Path(f.path).parent) in {d for _, d in trees}
                        and Path(f.path).name.startswith("pages-"))
    if pages_on_disk and ins.memory_dumped != pages_on_disk:
        ins.notes.append(f"the pagemaps account for {ins.memory_dumped} bytes but pages-*.img hold "
                         f"{pages_on_disk} (shared memory, or a page size other than {page_size})")
    return ins


def _from_manifest(root: Path, m: Manifest) -> Inspection:
    """The manifest's part of the model, with every value checked for its type."""
    try:
        d = m.device
        device = DeviceState(backend=str(d.backend), devices=[int(x) for x in d.devices],
                             allocations=int(d.allocations), bytes=int(d.bytes),
                             method=str(d.method),
                             runtime=None if d.runtime is None else str(d.runtime),
                             resources={str(k): int(v) for k, v in d.resources.items()},
                             referenced=int(d.referenced))
        parent = None if m.parent is None else os.path.normpath(os.path.join(root.absolute(), str(m.parent.path)))
        new = sum(int(f.size) for f in m.files if Path(str(f.path)).parts[:1] == (DEVICE_DIR,))
        return Inspection(
            directory=str(root.absolute()),
            format_version=int(m.format_version),
            created=str(m.created),
            host=str(m.host),
            kernel=str(m.kernel),
            npusnap_version=str(m.npusnap_version),
            criu_version=str(m.criu_version),
            pid=int(m.pid),
            command=[str(a) for a in m.command],
            options={k: v for k, v in m.options.items() if k not in ("host_pages", "device_images")},
            host_pages=m.options.get("host_pages") if isinstance(m.options.get("host_pages"), dict) else None,
            device_images=(m.options.get("device_images") if isinstance(m.options.get("device_images"), dict)
                           else None),
            processes=[],
            memory_dumped=0,
            device=device,
            phases=[_phase(p.name, p.seconds, p.bytes) for p in m.phases],
            images=_image_sizes(m),
            chain=ChainInfo(None if parent is None else str(parent), new, int(d.referenced)),
        )
    except (TypeError, ValueError, AttributeError) as e:
        raise ImageInvalid(f"manifest.yaml is malformed: {e}") from e


def _phase(name: str, seconds: float, nbytes: int) -> PhaseInfo:
    seconds, nbytes = float(seconds), int(nbytes)
    rate = nbytes / seconds if nbytes > 0 and seconds > 0 else None
    return PhaseInfo(str(name), seconds, nbytes, rate)


def _image_sizes(manifest: Manifest) -> ImageSizes:
    files = [ImageFile(str(f.path), int(f.size)) for f in manifest.files]
    by_dir: dict[str, int] = {}
    for f in files:
        top = Path(f.path).parts[0] if Path(f.path).parts else ""
        by_dir[top] = by_dir.get(top, 0) + f.size
    return ImageSizes(total=sum(f.size for f in files), by_directory=by_dir, files=files)


class _ImageReader:
    """Decodes the CRIU images the manifest lists; never anything else."""

    def __init__(self, root: Path, manifest: Manifest, criu_dir: str = CRIU_DIR) -> None:
        self.root = root
        self.criu_dir = criu_dir  # criu/, or a set member's criu/PID/
        self.listed = {str(f.path) for f in manifest.files if not f.chunks}  # packed pages: in the store
        for rel in sorted(self.listed):
            safe_member(root, rel)   # inside DIR, present, and no symlink on the way
        self._cache: dict[str, Optional[list[dict[str, Any]]]] = {}
        self._files: Optional[dict[int, dict[str, Any]]] = None

    def has(self, name: str) -> bool:
        return f"{self.criu_dir}/{name}" in self.listed

    def load(self, name: str, magic: str) -> Optional[list[dict[str, Any]]]:
        """The entries of criu/NAME, or None when the checkpoint has no such image."""
        if name in self._cache:
            return self._cache[name]
        rel = f"{self.criu_dir}/{name}"
        entries = self._decode(rel, magic) if rel in self.listed else None
        self._cache[name] = entries
        return entries

    def _decode(self, rel: str, magic: str) -> list[dict[str, Any]]:
        images = _pycriu_images()
        path = safe_member(self.root, rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == getattr(os, "ELOOP", 40):
                raise ImageInvalid(f"{rel} is a symlink; refusing to follow it") from e
            raise ImageInvalid(f"cannot read {rel}: {e.strerror}") from e
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ImageInvalid(f"{rel} is not a regular file")
            try:
                img = images.load(f)
            except Exception as e:  # pycriu raises whatever protobuf/struct raise
                reason = _reason(e)
                raise ImageInvalid(
                    f"{rel} is not a CRIU image pycriu can decode ({reason})",
                    "the checkpoint is damaged; `npusnap verify DIR` checks every file") from e
        if not isinstance(img, dict) or img.get("magic") != magic:
            found = img.get("magic") if isinstance(img, dict) else None
            raise ImageInvalid(f"{rel} is a {found} image, not {magic}")
        entries = img.get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ImageInvalid(f"{rel} decoded to something that is not a list of entries")
        return entries

    def one(self, name: str, magic: str) -> Optional[dict[str, Any]]:
        entries = self.load(name, magic)
        return entries[0] if entries else None

    def files(self) -> dict[int, dict[str, Any]]:
        """files.img: every open file of the tree, by id."""
        if self._files is None:
            self._files = {}
            for e in self.load("files.img", "FILES") or []:
                if isinstance(e.get("id"), int):
                    self._files[e["id"]] = e
        return self._files

    def path_of(self, file_id: Any) -> str:
        entry = self.files().get(file_id) if isinstance(file_id, int) else None
        reg = entry.get("reg") if entry else None
        return _text(reg.get("name", "")) if isinstance(reg, dict) else ""

    def exe_name(self, pid: int) -> str:
        mm = self.one(f"mm-{pid}.img", "MM")
        return self.path_of(mm.get("exe_file_id")) if mm else ""


def _reason(e: Exception) -> str:
    magic = getattr(e, "magic", None)
    if isinstance(magic, int):   # pycriu's MagicException carries only the number
        return f"unknown image magic {magic & 0xFFFFFFFF:#010x}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _pycriu_images() -> Any:
    try:
        import pycriu.images  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        from ..platform.criu import INSTALL_HINT

        raise EnvironmentProblem(f"pycriu is not importable ({e})", INSTALL_HINT) from e
    return pycriu.images


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return value if isinstance(value, str) else ""


# ---------------------------------------------------------------- processes and threads


def _processes(reader: _ImageReader, manifest: Manifest, notes: list[str]) -> list[ProcessInfo]:
    recorded = {p.pid: p for p in manifest.processes
                if isinstance(p.pid, int) and isinstance(p.ppid, int)}
    tree = reader.load("pstree.img", "PSTREE")
    procs: list[ProcessInfo] = []
    if tree is None:
        notes.append("no pstree.img: the process list comes from the manifest")
        for p in recorded.values():
            procs.append(ProcessInfo(pid=p.pid, ppid=p.ppid, pgid=0, sid=0, comm=str(p.comm),
                                     state="", threads=[ThreadInfo(p.pid, str(p.comm))]))
    else:
        pids = {_int(e.get("pid")) for e in tree}
        for e in tree:
            pid = _int(e.get("pid"))
            # pstree.img gives the root a ppid of 0 (its parent was outside the dump);
            # the manifest recorded the real one.
            ppid = _int(e.get("ppid"))
            if ppid not in pids and pid in recorded:
                ppid = recorded[pid].ppid
            tids = [t for t in e.get("threads", []) if isinstance(t, int)] or [pid]
            threads = [ThreadInfo(tid, _thread_comm(reader, tid)) for tid in tids]
            leader = reader.one(f"core-{pid}.img", "CORE")
            tc = leader.get("tc") if leader else None
            state = TASK_STATES.get(_int(tc.get("task_state")), "") if isinstance(tc, dict) else ""
            comm = threads[0].comm if threads[0].tid == pid else ""
            if not comm and pid in recorded:
                comm = str(recorded[pid].comm)
            procs.append(ProcessInfo(pid=pid, ppid=ppid, pgid=_int(e.get("pgid")),
                                     sid=_int(e.get("sid")), comm=comm, state=state,
                                     threads=threads))
    command = [str(a) for a in manifest.command] if isinstance(manifest.command, list) else []
    for proc in procs:
        if proc.pid == manifest.pid:
            proc.command = command
    return procs


def _thread_comm(reader: _ImageReader, tid: int) -> str:
    core = reader.one(f"core-{tid}.img", "CORE")
    if not core:
        return ""
    for key in ("thread_core", "tc"):
        part = core.get(key)
        if isinstance(part, dict) and part.get("comm"):
            return _text(part["comm"])
    return ""


# ---------------------------------------------------------------- memory


def _vma_kind(status: int, flags: int, start: int, end: int, stack_top: int) -> str:
    if status & (VMA_AREA_VDSO | VMA_AREA_VVAR | VMA_AREA_VSYSCALL):
        return "other"
    if status & (VMA_AREA_STACK | VMA_AREA_SHSTK) or flags & MAP_GROWSDOWN \
            or start <= stack_top < end:
        return "stack"
    if status & VMA_AREA_HEAP:
        return "heap"
    if status & (VMA_ANON_SHARED | VMA_FILE_SHARED | VMA_AREA_SYSVIPC | VMA_AREA_MEMFD):
        return "shared"
    if status & VMA_FILE_PRIVATE:
        return "file"
    if status & VMA_ANON_PRIVATE:
        return "anonymous"
    return "other"


def _memory(reader: _ImageReader, pid: int, page_size: int) -> Optional[MemoryInfo]:
    """Mappings from mm-PID.img, classified; dumped bytes from pagemap-PID.img."""
    mm = reader.one(f"mm-{pid}.img", "MM")
    if mm is None:
        return None
    stack_top = _int(mm.get("mm_start_stack"), -1)
    kinds = {k: MemoryKind(k, 0, 0, 0) for k in MEMORY_KINDS}
    vmas: list[tuple[int, int, str]] = []
    for v in mm.get("vmas", []):
        if not isinstance(v, dict):
            continue
        start, end = _int(v.get("start")), _int(v.get("end"))
        if end <= start:
            continue
        kind = _vma_kind(_int(v.get("status")), _int(v.get("flags")), start, end, stack_top)
        vmas.append((start, end, kind))
        kinds[kind].vmas += 1
        kinds[kind].mapped += end - start
    vmas.sort()
    starts = [v[0] for v in vmas]

    dumped = in_parent = 0
    for e in (reader.load(f"pagemap-{pid}.img", "PAGEMAP") or [])[1:]:   # [0] is the header
        nbytes = (_int(e.get("nr_pages")) or _int(e.get("compat_nr_pages"))) * page_size
        flags = _int(e.get("flags"))
        if flags & PE_PARENT or (not flags and e.get("in_parent")):
            in_parent += nbytes
            continue
        if flags and not flags & PE_PRESENT:
            continue
        dumped += nbytes
        _account(kinds, vmas, starts, _int(e.get("vaddr")), nbytes)

    return MemoryInfo(page_size=page_size, vmas=len(vmas),
                      mapped=sum(k.mapped for k in kinds.values()), dumped=dumped,
                      in_parent=in_parent,
                      kinds=[k for k in kinds.values() if k.vmas or k.dumped])


def _account(kinds: dict[str, MemoryKind], vmas: list[tuple[int, int, str]], starts: list[int],
             addr: int, nbytes: int) -> None:
    """Add a run of dumped pages to the kinds of the mappings it overlaps."""
    end = addr + nbytes
    i = max(bisect.bisect_right(starts, addr) - 1, 0)
    covered = 0
    while i < len(vmas) and vmas[i][0] < end:
        lo, hi = max(addr, vmas[i][0]), min(end, vmas[i][1])
        if hi > lo:
            kinds[vmas[i][2]].dumped += hi - lo
            covered += hi - lo
        i += 1
    if covered < nbytes:   # pages outside every recorded mapping: say so rather than guess
        kinds["other"].dumped += nbytes - covered


# ---------------------------------------------------------------- files and sockets


def _files_id(reader: _ImageReader, pid: int) -> Optional[int]:
    ids = reader.one(f"ids-{pid}.img", "IDS")
    fid = ids.get("files_id") if ids else None
    return fid if isinstance(fid, int) else None


def _fds(reader: _ImageReader, pid: int,
         files_id: Optional[int]) -> tuple[list[OpenFile], list[SocketInfo]]:
    # CRIU names the fd table after the files_id (inventory's fdinfo_per_id); old images, the pid.
    name = f"fdinfo-{pid}.img"
    if files_id is not None and reader.has(f"fdinfo-{files_id}.img"):
        name = f"fdinfo-{files_id}.img"
    fdinfo = reader.load(name, "FDINFO") or []
    files: list[OpenFile] = []
    sockets: list[SocketInfo] = []
    unix_names = {_int(u.get("ino")): _unix_name(u.get("name"))
                  for u in (e.get("usk") for e in reader.files().values()) if isinstance(u, dict)}
    for fd_entry in sorted(fdinfo, key=lambda e: _int(e.get("fd"))):
        fd = _int(fd_entry.get("fd"), -1)
        ftype = _text(fd_entry.get("type")) or "UND"
        entry = reader.files().get(_int(fd_entry.get("id"), -1), {})
        sock = _socket(fd, ftype, entry, unix_names)
        if sock is not None:
            sockets.append(sock)
        else:
            files.append(_open_file(reader, fd, ftype, entry))
    return files, sockets


def _open_file(reader: _ImageReader, fd: int, ftype: str, entry: dict[str, Any]) -> OpenFile:
    kind = ftype.lower()
    if ftype == "REG":
        reg = entry.get("reg") or {}
        access = ACCESS.get(_int(reg.get("flags")) & os.O_ACCMODE, "")
        return OpenFile(fd, kind, _text(reg.get("name")), access)
    if ftype == "PIPE":
        pipe = entry.get("pipe") or {}
        return OpenFile(fd, kind, f"pipe:[{_int(pipe.get('pipe_id'))}]",
                        ACCESS.get(_int(pipe.get("flags")) & os.O_ACCMODE, ""))
    if ftype == "FIFO":
        fifo = entry.get("fifo") or {}
        return OpenFile(fd, kind, reader.path_of(fifo.get("regf_id")))
    return OpenFile(fd, kind, kind)


def _socket(fd: int, ftype: str, entry: dict[str, Any],
            unix_names: dict[int, str]) -> Optional[SocketInfo]:
    if ftype == "UNIXSK":
        u = entry.get("usk") or {}
        peer_ino = _int(u.get("peer"))
        peer_name = (unix_names.get(peer_ino) or f"socket ino {peer_ino}") if peer_ino else ""
        return SocketInfo(fd, "unix", _sk_type(u.get("type")), _sk_state(u.get("state")),
                          _unix_name(u.get("name")), peer_name)
    if ftype == "INETSK":
        s = entry.get("isk") or {}
        family = _int(s.get("family"))
        fam = "inet6" if family == socket.AF_INET6 else "inet"
        proto = {6: "tcp", 17: "udp", 136: "udplite"}.get(_int(s.get("proto")), "")
        stype = _sk_type(s.get("type"))
        local = _inet_addr(family, s.get("src_addr"), _int(s.get("src_port")))
        dst_port = _int(s.get("dst_port"))
        peer = _inet_addr(family, s.get("dst_addr"), dst_port) if dst_port else ""
        return SocketInfo(fd, fam, f"{stype}/{proto}" if proto else stype,
                          _sk_state(s.get("state")), local, peer)
    if ftype in ("NETLINKSK", "PACKETSK"):
        return SocketInfo(fd, "netlink" if ftype == "NETLINKSK" else "packet", "", "", "")
    return None


SK_TYPES = {1: "stream", 2: "dgram", 3: "raw", 5: "seqpacket", 10: "packet"}
SK_STATES = {1: "established", 2: "syn_sent", 3: "syn_recv", 4: "fin_wait1", 5: "fin_wait2",
             6: "time_wait", 7: "close", 8: "close_wait", 9: "last_ack", 10: "listen",
             11: "closing"}


def _sk_type(value: Any) -> str:
    return SK_TYPES.get(_int(value), str(value) if value is not None else "")


def _sk_state(value: Any) -> str:
    return SK_STATES.get(_int(value), str(value) if value is not None else "")


def _unix_name(value: Any) -> str:
    """pycriu keeps unix socket names quoted-printable; abstract names start with NUL."""
    if value is None:
        return ""
    raw = value if isinstance(value, bytes) else str(value).encode("latin-1", "replace")
    try:
        name = quopri.decodestring(raw)
    except (ValueError, TypeError):
        name = raw
    if not name:
        return ""
    if name.startswith(b"\0"):
        return "@" + name[1:].rstrip(b"\0").decode("utf-8", "backslashreplace")
    return name.rstrip(b"\0").decode("utf-8", "backslashreplace")


def _inet_addr(family: int, words: Any, port: int) -> str:
    """CRIU stores addresses as the kernel's bytes read as native 32-bit words."""
    if not isinstance(words, list) or not all(isinstance(w, int) for w in words):
        return f"?:{port}"
    try:
        if family == socket.AF_INET6 and len(words) == 4:
            return f"[{socket.inet_ntop(socket.AF_INET6, struct.pack('=4I', *words))}]:{port}"
        if words:
            return f"{socket.inet_ntop(socket.AF_INET, struct.pack('=I', words[0]))}:{port}"
    except (struct.error, ValueError, OSError):
        pass
    return f"?:{port}"


def _cwd(reader: _ImageReader, pid: int) -> str:
    fs = reader.one(f"fs-{pid}.img", "FS")
    return reader.path_of(fs.get("cwd_id")) if fs else ""
