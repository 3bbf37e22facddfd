"""`criu swrk` started as a checkpoint or restore command starts, before it is needed.

CRIU probes the kernel on every run: ~40 ms of a tiny process's 60 ms dump wherever it keeps no
kdat cache (/run not a tmpfs). With npusnap's patch (scripts/criu-patches/0002) a `criu swrk`
started with CRIU_SWRK_EARLY_PROBE runs those probes at once rather than after its request
arrives; started here, before the command's own imports (~50 ms), they are done by the time the
dump or restore request is sent. take() hands the process to that request when it can serve it
(the same binary, no descriptor CRIU must hold, no terminal); whatever is not taken is killed and
reaped when the command ends (drop()). An unpatched CRIU just waits for its request, as before.

Light on purpose: it runs first, and CRIU starts only once it has. So no socket, subprocess or
typing module here (~10 ms of imports): the builtin _socket and os.posix_spawn."""

from __future__ import annotations

import _socket
import os

SEARCH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
COMMANDS = ("checkpoint", "restore", "dump")  # the commands whose request is a dump or a restore
EARLY_PROBE = "CRIU_SWRK_EARLY_PROBE"
EARLY_PROBE_LOG = "Kernel probed before the request"  # the patch's log line, in a CRIU that carries it
SIGPIPE, SIGXFSZ, SIGKILL = 13, 25, 9

_started: tuple[str, Spawned, _socket.socket] | None = None  # (realpath, the process, our end)


def clean_env() -> dict[str, str]:
    """Our environment without the agent preloaded (a job script under `npusnap run`
    may call npusnap; CRIU must not carry the agent into its own processes)."""
    env = dict(os.environ)
    preload = [p for p in env.pop("LD_PRELOAD", "").split() if "libnpusnap_agent" not in p]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env


class Spawned:
    """A child started with os.posix_spawn, with what Swrk uses of subprocess.Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone, its status unknown (as Popen)
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and self.poll() is None:
            import select

            fd = os.pidfd_open(self.pid)
            try:
                if not select.select([fd], [], [], timeout)[0]:
                    import subprocess

                    raise subprocess.TimeoutExpired(str(self.pid), timeout)
            finally:
                os.close(fd)
        if self.returncode is None:
            try:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            except ChildProcessError:
                self.returncode = 0
        return self.returncode


def probes_early(binary: str) -> bool:
    """Whether this CRIU carries the patch (its log line is in the binary): `npusnap check`."""
    try:
        with open(binary, "rb") as f:
            return EARLY_PROBE_LOG.encode() in f.read()
    except OSError:
        return False


def start(argv: list[str]) -> None:
    """Start `criu swrk` if argv (the CLI's, without the program) runs a command that will send it
    a dump or restore request. Any failure here only means the request starts its own later."""
    global _started
    command, rest = _command(argv)
    if command not in COMMANDS or _started is not None or any(a in ("-h", "--help") for a in rest):
        return
    binary = _option(rest, "--criu") or os.environ.get("NPUSNAP_CRIU") or _on_path()
    if not binary:
        return
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    try:
        if theirs.fileno() <= 2:  # we were started without stdio: /dev/null would land on it
            raise OSError("no standard descriptors")
        proc = _spawn(binary, theirs.fileno())
    except (OSError, NotImplementedError):  # no POSIX_SPAWN_SETSID: the request starts its own
        ours.close()
        return
    finally:
        theirs.close()
    # (A Ctrl-C before this line leaves it to exit by itself, at its socket's end.)
    _started = (os.path.realpath(binary), proc, ours)


def _spawn(binary: str, fd: int) -> Spawned:
    """As Swrk starts CRIU: in a session of its own (a Ctrl-C at the terminal reaches us, not
    CRIU), /dev/null for stdio, no descriptor of ours but its socket, SIGPIPE back to default."""
    os.set_inheritable(fd, True)
    actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
        (os.POSIX_SPAWN_OPEN, n, "/dev/null", os.O_RDWR, 0) for n in (0, 1, 2)]
    for name in os.listdir("/proc/self/fd"):  # what our parent let us inherit, as close_fds would
        n = int(name)
        if n > 2 and n != fd and _inheritable(n):
            actions.append((os.POSIX_SPAWN_CLOSE, n))
    env = clean_env()
    env[EARLY_PROBE] = "1"
    pid = os.posix_spawn(binary, [binary, "swrk", str(fd)], env, file_actions=actions, setsid=True,
                         setsigdef=(SIGPIPE, SIGXFSZ))
    return Spawned(pid)


def _inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:  # the listing's own descriptor, closed by now
        return False


def take(binary: str) -> tuple[Spawned, _socket.socket] | None:
    """The CRIU started early, if it is binary and still waiting; else None (and it is dropped)."""
    global _started
    if _started is None:
        return None
    path, proc, ours = _started
    _started = None
    if path == os.path.realpath(binary) and proc.poll() is None:
        return proc, ours
    _drop(proc, ours)
    return None


def drop() -> None:
    """The command ends: a CRIU started early and never used is killed and reaped."""
    global _started
    if _started is not None:
        _, proc, ours = _started
        _started = None
        _drop(proc, ours)


def _drop(proc: Spawned, ours: _socket.socket) -> None:
    ours.close()  # an idle swrk exits by itself at its socket's end; killed, its probes end too
    try:
        os.killpg(proc.pid, SIGKILL)
    except OSError:
        pass
    proc.wait()


def _command(argv: list[str]) -> tuple[str | None, list[str]]:
    """The command word past the root's own options (-v, --config FILE), and what follows it."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return a, argv[i + 1:]
    return None, []


def _option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def _on_path() -> str | None:
    """The first executable `criu` where find_criu() looks first (it also skips ones too old:
    take() then finds another binary chosen, and drops this one)."""
    for d in dict.fromkeys(os.environ.get("PATH", "").split(os.pathsep) + list(SEARCH_DIRS)):
        path = os.path.join(d, "criu")
        if d and os.access(path, os.X_OK):
            return path
    return None
