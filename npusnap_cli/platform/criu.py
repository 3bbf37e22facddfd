"""Driving CRIU: find a usable binary, then speak its protobuf RPC (`criu swrk`)
with our own encoding of its messages (criurpc.py). Never parses CRIU's text output.

We spawn `criu swrk` ourselves instead of using pycriu's helper so that every
request has a deadline, CRIU can be killed on Ctrl-C, and its exit is reaped.
"""

from __future__ import annotations

import _socket  # the builtin: socket.py's enums are ~2 ms of imports before CRIU's request
import contextlib
import errno as errno_mod
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from .. import warmup
from ..criuopts import CriuOptions
from ..errors import CriuFailed, EnvironmentProblem, Interrupted, NpusnapError, StorageProblem
from . import criurpc, criustart
from .criustart import SEARCH_DIRS, clean_env

MIN_VERSION = (4, 1)
INSTALL_HINT = "run scripts/install-criu.sh (builds CRIU >= 4.1), or point NPUSNAP_CRIU at a CRIU >= 4.1"
# A `criu swrk`: spawned by a request, or started as the command began (criustart.py)
CriuProcess = Union["subprocess.Popen[bytes]", criustart.Spawned]


def rpc_messages() -> Any:
    """CRIU's RPC messages: our own encoder and decoder of rpc.proto's wire format (criurpc.py),
    which spares every checkpoint and restore the protobuf runtime's import."""
    return criurpc


@dataclass
class CriuBinary:
    """A CRIU binary and its version."""

    path: str
    version: tuple[int, ...]

    @property
    def version_str(self) -> str:
        return ".".join(map(str, self.version))


def binary_version(path: str) -> tuple[int, ...]:
    """A CRIU binary's version, asked over RPC once per binary (cached by path, size, mtime:
    every command needs it, and a `criu swrk` round trip costs ~0.1 s)."""
    import json

    try:
        st = os.stat(path)
    except OSError as e:
        raise CriuFailed(f"cannot run {path}: {e.strerror}", INSTALL_HINT) from e
    key = f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npusnap" / "criu-versions.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), list):
        return tuple(int(x) for x in known[key])
    version = _ask_version(path)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**(known if isinstance(known, dict) else {}), key: list(version)}))
        os.replace(tmp, cache)
    except OSError:
        pass  # a cache we cannot write only costs time
    return version


def _ask_version(path: str) -> tuple[int, ...]:
    rpc = rpc_messages()
    req = rpc.criu_req(type=rpc.VERSION)
    resp = Swrk(path).request(req, timeout=20)
    v = resp.version
    parts = [v.major_number, v.minor_number]
    if v.HasField("sublevel"):
        parts.append(v.sublevel)
    return tuple(parts)


def find_criu(explicit: Optional[str] = None) -> CriuBinary:
    """The CRIU to use: NPUSNAP_CRIU / explicit path, else the first >= 4.1 on PATH.

    Older binaries (Debian 12 ships 3.17, which fails on recent kernels) are
    skipped, so they are never picked up by mistake.
    """
    explicit = explicit or os.environ.get("NPUSNAP_CRIU")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise EnvironmentProblem(f"CRIU binary {explicit} is not executable", INSTALL_HINT)
        try:
            found = CriuBinary(explicit, binary_version(explicit))
        except CriuFailed as e:
            raise EnvironmentProblem(f"{explicit} is not a working CRIU: {e.message}", INSTALL_HINT) from e
        if found.version < MIN_VERSION:
            raise EnvironmentProblem(f"CRIU {found.version_str} at {explicit} is too old (need >= 4.1)", INSTALL_HINT)
        return found
    seen: list[str] = []
    dirs = os.environ.get("PATH", "").split(os.pathsep) + list(SEARCH_DIRS)
    for d in dict.fromkeys(dirs):
        path = os.path.join(d, "criu")
        if not os.access(path, os.X_OK) or os.path.realpath(path) in seen:
            continue
        seen.append(os.path.realpath(path))
        try:
            version = binary_version(path)
        except CriuFailed:
            continue
        if version >= MIN_VERSION:
            return CriuBinary(path, version)
        seen[-1] += f" ({'.'.join(map(str, version))}, too old)"
    where = "; found " + ", ".join(seen) if seen else ""
    raise EnvironmentProblem(f"no CRIU >= 4.1 found{where}", INSTALL_HINT)


class Swrk:
    """One `criu swrk` process and its RPC socket."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def request(self, req: Any, timeout: Optional[float] = None, pass_fds: tuple[int, ...] = (),
                terminal: Optional[int] = None, started: Optional[Callable[[int], None]] = None,
                on_notify: Optional[Callable[[str], None]] = None) -> Any:
        """One request. With a terminal fd, CRIU runs in our session with that terminal
        as stdin, as a shell-job restore needs (it hands the terminal to the restored
        job, which joins our session and process group, as under bare `criu restore`).
        on_notify (with the request's notify_scripts): called with each of CRIU's notifications
        (its action scripts' names), CRIU waiting for our answer; the first that raises makes
        CRIU fail the request, and is raised once CRIU has answered."""
        rpc = rpc_messages()
        early = None
        if req.type in (rpc.DUMP, rpc.RESTORE) and not pass_fds and terminal is None:
            early = criustart.take(self.binary)  # the one started as the command began, its probes done
        if early is not None:
            proc: CriuProcess = early[0]
            ours = early[1]
        else:
            proc, ours = self._spawn(pass_fds, terminal)
        try:
            if started is not None:
                started(proc.pid)
            try:
                ours.send(req.SerializeToString())
            except OSError:
                pass  # it died at once; reported below as "exited without answering"
            warmup.idle()  # CRIU works: the imports for afterwards run meanwhile
            deadline = None if timeout is None else time.monotonic() + timeout
            failure: Optional[BaseException] = None
            while True:
                resp = self._answer(ours, proc, deadline, timeout)
                if resp.type != rpc.NOTIFY or on_notify is None:
                    break
                try:
                    if failure is None:
                        on_notify(resp.notify.script)
                except BaseException as e:  # CRIU is told, fails the request; raised once it answered
                    failure = e
                ours.send(rpc.criu_req(type=rpc.NOTIFY, notify_success=failure is None).SerializeToString())
            if failure is not None:
                raise failure
            return resp
        except KeyboardInterrupt:
            raise Interrupted() from None
        finally:
            ours.close()
            _reap(proc)

    def _spawn(self, pass_fds: tuple[int, ...],
               terminal: Optional[int]) -> tuple[subprocess.Popen[bytes], _socket.socket]:
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [self.binary, "swrk", str(theirs.fileno())],
                pass_fds=(theirs.fileno(), *pass_fds),
                stdin=subprocess.DEVNULL if terminal is None else terminal,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Otherwise a session of its own: a Ctrl-C at the terminal reaches us, not CRIU mid-dump.
                start_new_session=terminal is None,
                env=clean_env(),
            )
        except OSError as e:
            ours.close()
            raise CriuFailed(f"cannot run {self.binary}: {e}", INSTALL_HINT) from e
        finally:
            theirs.close()
        return proc, ours

    def _answer(self, ours: _socket.socket, proc: CriuProcess,
                deadline: Optional[float], timeout: Optional[float]) -> Any:
        """CRIU's next message: its answer, or a notification."""
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ours.settimeout(None if remaining is None else min(remaining, 0.5))
            try:
                size = len(ours.recv(1, _socket.MSG_TRUNC | _socket.MSG_PEEK))
                buf = ours.recv(max(size, 1))
                break
            except (ConnectionError, BrokenPipeError):
                buf = b""
                break
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise CriuFailed(f"CRIU did not answer within {timeout:.0f} s; it was stopped") from None
                if proc.poll() is not None:
                    break
        if not buf:
            raise CriuFailed(f"CRIU exited without answering (status {proc.poll()})")
        resp = rpc_messages().criu_resp()
        try:
            resp.ParseFromString(buf)
        except ValueError as e:
            raise CriuFailed(f"CRIU's answer is not an RPC answer ({e}): is {self.binary} CRIU?") from None
        return resp


def wait_exit(proc: CriuProcess, timeout: float) -> None:
    """proc.wait(timeout), woken the instant the child exits: Popen.wait with a timeout polls, in
    sleeps growing to 50 ms, which a command that reaps a child or two pays on every run."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # gone already (reaped), or no pidfd on this kernel
        proc.wait(timeout=timeout)
        return
    try:
        import select

        select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    proc.wait(timeout=0.5 if proc.poll() is None else None)


def _reap(proc: CriuProcess) -> None:
    try:
        wait_exit(proc, timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


# Error lines that never explain a failure: harmless on this kind of machine, or just the verdict
# (a failed task, the pid whose files failed, the last words of a restore).
UNINFORMATIVE = ("Can't setup RLIMIT_NOFILE", "Dumping FAILED", "Restoring FAILED", "failed with -1",
                 "killed by signal", "exited, status=", "Failed to dump files", "Dump files (pid")

# CRIU's lines that say what is wrong, with what to do about it in npusnap's terms.
ACTIONABLE = (
    ("Use link-remap option", "checkpoint with --link-remap (open files that were unlinked)"),
    ("increase limit", "checkpoint with a larger --ghost-limit (e.g. --ghost-limit 64M): a deleted open file "
                       "is larger than the limit"),
    ("External socket is used", "checkpoint with --ext-unix-sk (a Unix socket's peer is outside the tree)"),
    ("External socket found in image", "restore needs --ext-unix-sk; checkpoint with it again"),
    ("Can't dump half of stream unix connection",
     "a stream Unix socket is connected outside the tree, which CRIU cannot dump: include its peer "
     "in the tree, or close it first (--ext-unix-sk covers datagram sockets only)"),
    ("In-flight connection", "checkpoint with --skip-in-flight (connections not yet accepted)"),
    ("consider using --tcp-established", "checkpoint with --tcp-established, or --tcp-close"),
    ("Need to set the --tcp-close", "restore with --tcp-close"),
    ("Iptables configuration failed", "use another --network-lock (`npusnap check` shows what works here)"),
    ("Locking network failed", "use another --network-lock (`npusnap check` shows what works here)"),
    ("has bad size", "a file changed size since the checkpoint (the workload's output, often): "
                     "put back its size from the message (truncate -s), or restore from a copy"),
)


def _error_lines(log: Path) -> list[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if "Error (" in line]


def _message(line: str) -> str:
    """An error line without CRIU's timestamp, pid and source position."""
    head, sep, rest = line.partition("Error (")
    if sep:
        _, sep2, msg = rest.partition("): ")
        if sep2:
            return " ".join(msg.split())
    return " ".join(line.split())


def explain(log: Path) -> tuple[str, Optional[str]]:
    """The line of CRIU's log that says why it failed, and the npusnap hint for it when known:
    the first actionable line, else the last error line that is not just a verdict."""
    errors = _error_lines(log)
    for line in errors:
        for needle, hint in ACTIONABLE:
            if needle in line:
                return _message(line), hint
    informative = [line for line in errors if not any(h in line for h in UNINFORMATIVE)]
    if informative:
        return _message(informative[-1]), None
    return (_message(errors[-1]), None) if errors else ("", None)


def _failure(resp: Any, what: str, log: Path) -> NpusnapError:
    err = resp.cr_errno if resp.HasField("cr_errno") else 0
    msg = resp.cr_errmsg if resp.HasField("cr_errmsg") and resp.cr_errmsg else ""
    line, advice = explain(log)
    detail = line or " ".join(msg.split()) or (os.strerror(err) if err else "failed")
    hint = f"{advice}; see {log}" if advice else f"see {log}"
    if err == errno_mod.EEXIST and what == "restore":
        return CriuFailed(f"CRIU restore failed: a process already uses a pid from the image ({detail})",
                          "stop that process, or restore on another machine")
    if err == errno_mod.ENOSPC or "No space left on device" in detail:
        return StorageProblem(f"CRIU {what} failed: no space left on device ({detail})",
                              "free space where the checkpoint goes, or choose another directory")
    return CriuFailed(f"CRIU {what} failed: {detail}", hint)


# CRIU's dump failures that describe a passing moment, not the tree: the dump is tried again.
TRANSIENT_DUMP_ERRORS = ("Zombies with threads are not supported",)
DUMP_ATTEMPTS = 3


def _empty_images_dir(images_dir: Path) -> None:
    """Removes a failed attempt's images (our staging directory: plain files CRIU wrote)."""
    fd = os.open(images_dir, os.O_DIRECTORY | os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in os.listdir(fd):
            with contextlib.suppress(IsADirectoryError, FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


@dataclass
class DumpOptions:
    """One `criu dump` request's settings."""

    pid: int
    images_dir: Path
    log_dir: Path
    leave_running: bool = False
    leave_stopped: bool = False
    shell_job: bool = False
    tcp_established: bool = False
    timeout: Optional[float] = None
    log_level: int = 4
    extra: CriuOptions = field(default_factory=CriuOptions)  # link-remap, ghost-limit, network lock, ...
    started: Optional[Callable[[int], None]] = None  # told CRIU's pid (the guardian waits for it if we die)
    # run by CRIU's `pre-dump` notification: after CRIU's own start-up (its kernel probes, ~35 ms
    # here), just before it freezes the tree. A failure there fails the dump (the tree untouched)
    pre_dump: Optional[Callable[[], None]] = None


class Criu:
    def __init__(self, binary: CriuBinary) -> None:
        self.binary = binary

    def check(self) -> tuple[bool, str]:
        rpc = rpc_messages()
        resp = Swrk(self.binary.path).request(rpc.criu_req(type=rpc.CHECK), timeout=60)
        if resp.success:
            return True, "Looks good."
        return False, (resp.cr_errmsg if resp.HasField("cr_errmsg") else "") or "criu check failed"

    def features(self) -> dict[str, bool]:
        """Optional kernel features as CRIU probes them (FEATURE_CHECK)."""
        rpc = rpc_messages()
        feats = rpc.criu_features(mem_track=True, lazy_pages=True, pidfd_store=True)
        resp = Swrk(self.binary.path).request(rpc.criu_req(type=rpc.FEATURE_CHECK, features=feats), timeout=60)
        f = resp.features
        return {name: bool(getattr(f, name)) for name in ("mem_track", "lazy_pages", "pidfd_store") if f.HasField(name)}

    def dump(self, o: DumpOptions) -> None:
        # A process caught in the middle of its exit (a zombie whose threads are still going) makes
        # CRIU give up; a moment later it is an ordinary zombie. CRIU has resumed the tree by then.
        for attempt in range(1, DUMP_ATTEMPTS + 1):
            resp = self._dump_once(o)
            if resp.success:
                return
            if attempt == DUMP_ATTEMPTS or not any(t in line for line in _error_lines(o.log_dir / "dump.log")
                                                   for t in TRANSIENT_DUMP_ERRORS):
                raise _failure(resp, "dump", o.log_dir / "dump.log")
            _empty_images_dir(o.images_dir)
            time.sleep(0.05 * attempt)

    def _dump_once(self, o: DumpOptions) -> Any:
        rpc = rpc_messages()
        opts = rpc.criu_opts(images_dir_fd=-1)
        opts.pid = o.pid
        opts.leave_running = o.leave_running
        opts.leave_stopped = o.leave_stopped
        opts.shell_job = o.shell_job
        opts.tcp_established = o.tcp_established
        opts.log_level = o.log_level
        opts.log_file = "dump.log"
        opts.file_locks = True
        opts.notify_scripts = o.pre_dump is not None
        if o.timeout:
            opts.timeout = int(o.timeout)
        fds = o.extra.apply(opts, rpc)
        pre_dump = o.pre_dump

        def notified(script: str) -> None:
            if script == "pre-dump" and pre_dump is not None:
                pre_dump()

        with _dir_fds(o.images_dir, o.log_dir) as (images_fd, log_fd):
            opts.images_dir_fd = images_fd  # a descriptor, not a path: any byte in -D works
            opts.work_dir_fd = log_fd
            resp = Swrk(self.binary.path).request(
                rpc.criu_req(type=rpc.DUMP, opts=opts),
                timeout=None if not o.timeout else o.timeout + 30,
                pass_fds=fds, started=o.started,
                on_notify=notified if o.pre_dump is not None else None,
            )
        return resp

    def restore(self, images_dir: Path, log_dir: Path, shell_job: bool = False,
                tcp_established: bool = False, log_level: int = 4, extra: Optional[CriuOptions] = None,
                started: Optional[Callable[[int], None]] = None, leave_stopped: bool = False,
                lazy_pages: bool = False) -> int:
        """Restore the tree; returns the root pid. The restored root becomes our
        child once `criu swrk` exits, because main() made us a child subreaper. With
        leave_stopped every restored process is left stopped (SIGSTOP) for the caller to resume.
        lazy_pages: memory pages come from the LazyPages daemon serving log_dir (userfaultfd)."""
        rpc = rpc_messages()
        opts = rpc.criu_opts(images_dir_fd=-1)
        opts.shell_job = shell_job
        opts.leave_stopped = leave_stopped
        opts.lazy_pages = lazy_pages
        opts.tcp_established = tcp_established
        opts.log_level = log_level
        opts.log_file = "restore.log"
        opts.file_locks = True
        fds = (extra or CriuOptions()).apply(opts, rpc)
        with _dir_fds(images_dir, log_dir) as (images_fd, log_fd), _terminal(shell_job) as tty:
            opts.images_dir_fd = images_fd
            opts.work_dir_fd = log_fd
            resp = Swrk(self.binary.path).request(rpc.criu_req(type=rpc.RESTORE, opts=opts),
                                                  pass_fds=fds, terminal=tty,
                                                  started=started)
        if not resp.success:
            error = _failure(resp, "restore", log_dir / "restore.log")
            if shell_job and tty is None:
                error.hint = ("a shell job is restored onto a terminal: run `npusnap restore` from one; "
                              f"details in {log_dir / 'restore.log'}")
            raise error
        return int(resp.restore.pid)

    def dumped_tree(self, images_dir: Path) -> list[tuple[int, int, int]]:
        from .criuimages import dumped_tree

        return dumped_tree(images_dir)

    def lazy_pages(self, images_dir: Path, log_dir: Path) -> "LazyPages":
        """`criu lazy-pages` for images_dir, listening in log_dir for a restore with lazy_pages."""
        return LazyPages(self.binary.path, images_dir, log_dir)

    def release_network_lock(self, images_dir: Path, method: Optional[str], pids: list[int],
                             warn: Callable[[str], None]) -> None:
        """Before a dumped tree runs on: undo the network lock CRIU keeps for a tree it leaves stopped
        (only a dumped INET socket's TCP connection is locked: without one, there is nothing to undo)."""
        from .criuimages import holds_inet_sockets

        if not holds_inet_sockets(images_dir):
            return
        from .. import netlock

        netlock.release(images_dir, method, pids, warn=warn)


LAZY_SOCKET = "lazy-pages.socket"  # CRIU's name, in the work directory of both sides
LAZY_READY_S = 30.0  # for `criu lazy-pages` to listen (a loaded machine takes seconds to start it)


class LazyPages:
    """`criu lazy-pages`: serves a lazily restored tree its memory pages from the images over
    userfaultfd, on first touch and in the background, and exits by itself once every page is
    in (or the tree is gone). Started before the restore, in log_dir (where the restore looks for
    its socket); ours to reap: finish() waits for it, kill() ends it."""

    def __init__(self, binary: str, images_dir: Path, log_dir: Path) -> None:
        self.log = log_dir / "lazy-pages.log"
        self.socket = log_dir / LAZY_SOCKET  # log_dir: a directory the restore made just now
        with _dir_fds(images_dir, log_dir) as (images_fd, log_fd):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(LAZY_SOCKET, dir_fd=log_fd)  # a stale one from an earlier restore
            try:
                # The directories as our own descriptors: no path CRIU resolves can be a planted link.
                self.proc = subprocess.Popen(
                    [binary, "lazy-pages", "-D", f"/proc/self/fd/{images_fd}", "-W", f"/proc/self/fd/{log_fd}",
                     "-o", "lazy-pages.log", "-v4"],
                    pass_fds=(images_fd, log_fd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True, env=clean_env())
            except OSError as e:
                raise CriuFailed(f"cannot run {binary} lazy-pages: {e}", INSTALL_HINT) from e
            deadline = time.monotonic() + LAZY_READY_S
            # Listening, not only bound: bind() makes the file before listen() lets a connect in (a
            # restore whose CRIU probed the kernel ahead, criustart.py, connects within that window).
            while not (_is_socket(log_fd, LAZY_SOCKET) and _listening(self.proc.pid, LAZY_SOCKET)):
                if self.proc.poll() is not None or time.monotonic() >= deadline:
                    self.kill()
                    raise CriuFailed("CRIU's lazy-pages daemon did not start", f"see {self.log}")
                time.sleep(0.01)

    def finish(self, timeout: float) -> Optional[int]:
        """Its exit status once every page is in (None if it is still serving after timeout)."""
        try:
            wait_exit(self.proc, timeout)
        except subprocess.TimeoutExpired:
            return None
        self._gone()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._gone()

    def _gone(self) -> None:
        """Its socket, which it leaves behind (not a log: a checkpoint's logs/ holds only files)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)


def _listening(pid: int, name: str) -> bool:
    """Whether process pid holds a listening Unix socket bound to name: its sockets' inodes
    (/proc/PID/fd), looked up in /proc/net/unix (flag __SO_ACCEPTCON: listen() was called)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:["):-1])
        with open("/proc/net/unix") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return False
    for line in lines:  # Num RefCount Protocol Flags Type St Inode Path
        fields = line.split()
        if (len(fields) >= 8 and fields[6] in inodes and int(fields[3], 16) & 0x10000
                and fields[7].rsplit("/", 1)[-1] == name):
            return True
    return False


def _is_socket(dir_fd: int, name: str) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _dir_fds(*dirs: Path) -> Iterator[list[int]]:
    """The directories opened for CRIU, never through a link. CRIU reaches them as /proc/OUR_PID/fd/N
    (our pid: the socket's peer), so it need not inherit them."""
    fds: list[int] = []
    try:
        for d in dirs:
            fds.append(os.open(d, os.O_DIRECTORY | os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


@contextlib.contextmanager
def _terminal(shell_job: bool) -> Iterator[Optional[int]]:
    """For a shell-job restore, our terminal (stdin, else /dev/tty): the restored job
    goes back onto it. None when not a shell job or when we have no terminal."""
    if not shell_job:
        yield None
        return
    if os.isatty(0):
        yield 0
        return
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def become_subreaper() -> None:
    """Adopt orphans (the restored process, once `criu swrk` exits) so we can wait for it."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
