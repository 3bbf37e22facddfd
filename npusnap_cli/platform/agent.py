"""Client of the agent that lives inside a target process (native/agent/).

The agent listens on the abstract Unix socket ``@npusnap-agent-<pid>``, or
``@npusnap-agent-<pid>-<hex>`` when another process squats that name (anyone
may bind any abstract name). So a name proves nothing: the client finds the
listening socket among the target's own descriptors and, once connected,
requires SO_PEERCRED to name the target's pid and uid (the agent checks our
uid in turn). Each request is one connection: one line out, one JSON line
back, closed by the agent. No connection is kept, so CRIU can dump the
process between requests.

A lock may be held on a lease (``lock(timeout_s, lease_s)``, ``renew(lease_s)``):
if the CLI stops renewing it (it died), the agent puts the process back to
RUNNING by itself once the lease has run out in the process's own run time
(time spent frozen by CRIU or stopped by SIGSTOP does not count).

The exceptions all derive from :class:`AgentProblem`, a DeviceFailed of npusnap's one error
tree (errors.py), and carry a ``hint`` saying how to fix the problem; agent_error() turns them
into the kind the CLI reports.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from .. import _protocol as P
from ..errors import DeviceFailed, LockTimeout, NpusnapError, PermissionProblem, TargetNotFound, WrongState
from ..native import AGENT_LIB, INJECTOR, agent_socket_name

# Codes in the reply besides the runtime's own aclError values (native/include/npusnap/agent.h).
ACL_SUCCESS = P.AGENT_OK
LOCK_TIMEOUT = P.AGENT_LOCK_TIMEOUT  # the runtime's lock did not finish in the caller's time
E_REQUEST = P.AGENT_E_REQUEST  # the agent did not understand the request
E_NO_RUNTIME = P.AGENT_E_NO_RUNTIME  # no device runtime is loaded in the process
E_STATE = P.AGENT_E_STATE  # wrong order for the current state (e.g. backup while RUNNING)
E_BUSY = P.AGENT_E_BUSY  # an abandoned lock is still inside the runtime
E_DENIED = P.AGENT_E_DENIED  # our uid may not control the process
E_INTERNAL = P.AGENT_E_INTERNAL  # resource failure inside the agent
E_UNSUPPORTED = P.AGENT_E_UNSUPPORTED  # the runtime lacks the direct data path (`backup external` on CANN)
E_LEASE_LOST = P.AGENT_E_LEASE_LOST  # renew after the lease ran out: the agent took the process back (fencing)

# npusnap-inject exit statuses (native/include/npusnap/inject.h).
INJECT_USAGE, INJECT_NO_PROCESS, INJECT_PERMISSION = P.INJECT_USAGE, P.INJECT_NO_PROCESS, P.INJECT_PERMISSION
INJECT_DLOPEN_FAILED, INJECT_FAILED, INJECT_DAMAGED = P.INJECT_DLOPEN_FAILED, P.INJECT_FAILED, P.INJECT_DAMAGED

CONNECT_TIMEOUT_S = 2.0
DEFAULT_TIMEOUT_S = 10.0  # ping, status
TRANSFER_TIMEOUT_S = 3600.0  # backup and restore copy device memory: can be long
LOCK_GRACE_S = 10.0  # added to the lock timeout for the reply to come back
MAX_REPLY = 1 << 20

_START_HINT = "start it with `npusnap run -- CMD` or inject with `npusnap attach PID`"


class AgentProblem(DeviceFailed):
    """Base of the agent client's errors. `kind`: the npusnap error it is reported as."""

    kind: type[NpusnapError] = DeviceFailed


class AgentNotFound(AgentProblem):
    """No agent listens for that pid (or the process does not exist)."""

    default_hint = _START_HINT
    kind = WrongState


class AgentImpostor(AgentProblem):
    """The socket under the agent's name is not the target's own: someone squats it."""

    default_hint = ("another user's process has bound the agent's socket name; npusnap ignores it "
                    "(run as root, or as the target's owner, to find the agent through the target's descriptors)")
    kind = PermissionProblem


class AgentProtocolError(AgentProblem):
    """The agent did not answer in time or answered something unreadable."""

    default_hint = "run with NPUSNAP_AGENT_LOG=/tmp/agent.log in the target's environment to see what it did"


class AgentError(AgentProblem):
    """The agent answered ok=false."""

    def __init__(self, reply: AgentReply, command: str) -> None:
        self.reply = reply
        self.code = reply.code
        self.command = command
        self.kind, hint = AGENT_CODE_ERRORS.get(reply.code, (DeviceFailed, None))
        super().__init__(f"agent refused `{command}`: {reply.error} (code {reply.code})", hint)


class LockTimeoutError(AgentError):
    """The runtime's lock did not complete in time; the agent undoes it if it succeeds later."""


class InjectFailed(AgentProblem):
    """npusnap-inject could not load the agent into the process."""

    def __init__(self, message: str, hint: Optional[str] = None, exit_status: int = 0) -> None:
        self.kind, default_hint = INJECT_STATUS_ERRORS.get(exit_status, (DeviceFailed, None))
        super().__init__(message, hint if hint is not None else default_hint)
        self.exit_status = exit_status


# The one translation of the agent's reply codes: the npusnap error each is reported as, and
# what to do about it (any other code: DeviceFailed).
AGENT_CODE_ERRORS: dict[int, tuple[type[NpusnapError], Optional[str]]] = {
    LOCK_TIMEOUT: (LockTimeout, "device work did not drain in time; retry with a longer lock timeout"),
    E_STATE: (WrongState, "run `npusnap status PID` to see which phase the process is in"),
    E_BUSY: (DeviceFailed, "an earlier lock timed out and is still pending in the runtime; retry in a moment"),
    E_NO_RUNTIME: (WrongState, "the process has not loaded a device runtime (libascendcl) yet"),
    E_DENIED: (PermissionProblem, "run as root or as the process's owner"),
    E_UNSUPPORTED: (DeviceFailed, "this runtime offers only the in-process path: use plain backup/restore"),
    E_LEASE_LOST: (DeviceFailed, "npusnap was stopped longer than its lease; checkpoint again, or raise --lease"),
}


@dataclass(frozen=True)
class AgentReply:
    ok: bool
    code: int
    state: Optional[str]
    error: Optional[str]
    elapsed_ms: float
    pid: int
    runtime: Optional[str]
    device: Optional[dict[str, Any]] = field(default=None)
    # ms of run time left on the lock's lease; None when no lease is armed
    lease_ms_left: Optional[float] = field(default=None)
    lease_lost: bool = False  # the lock's last lease ran out (renew is refused until the next lock)
    # while a lease is armed: where lease_lost lives in the process's memory (read while it is frozen)
    lease_lost_at: Optional[int] = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentReply:
        device = data.get(P.AGENT_REPLY_DEVICE)
        lease_ms_left = data.get(P.AGENT_REPLY_LEASE_MS_LEFT)
        lease_lost_at = data.get(P.AGENT_REPLY_LEASE_LOST_AT)
        return cls(
            ok=bool(data[P.AGENT_REPLY_OK]),
            code=int(data[P.AGENT_REPLY_CODE]),
            state=data.get(P.AGENT_REPLY_STATE),
            error=data.get(P.AGENT_REPLY_ERROR),
            elapsed_ms=float(data.get(P.AGENT_REPLY_ELAPSED_MS, 0.0)),
            pid=int(data.get(P.AGENT_REPLY_PID, 0)),
            runtime=data.get(P.AGENT_REPLY_RUNTIME),
            device=device if isinstance(device, dict) else None,
            lease_ms_left=float(lease_ms_left) if isinstance(lease_ms_left, (int, float)) else None,
            lease_lost=data.get(P.AGENT_REPLY_LEASE_LOST) is True,
            lease_lost_at=lease_lost_at if type(lease_lost_at) is int and lease_lost_at > 0 else None,
        )


class AgentClient:
    """Talks to the agent inside process ``pid``; every call is one connection."""

    def __init__(self, pid: int, connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.pid = pid
        self.connect_timeout = connect_timeout

    # -- commands -------------------------------------------------------------
    def ping(self) -> AgentReply:
        return self.request(P.AGENT_CMD_PING)

    def status(self) -> AgentReply:
        return self.request(P.AGENT_CMD_STATUS)

    def lock(self, timeout_s: float, lease_s: Optional[float] = None) -> AgentReply:
        """Lock; with lease_s the lock is held on a lease: unless renewed (renew) within
        lease_s seconds of the process's run time, the agent undoes it by itself
        (unlocks, or restores the device and unlocks when backed up)."""
        ms = max(0, int(timeout_s * 1000))
        line = f"{P.AGENT_CMD_LOCK} {ms}"
        if lease_s is not None:
            if lease_s <= 0:
                raise ValueError("lease_s must be > 0")
            line += f" {max(1, int(lease_s * 1000))}"
        return self.request(line, timeout=timeout_s + LOCK_GRACE_S)

    def renew(self, lease_s: float, timeout: float = DEFAULT_TIMEOUT_S) -> AgentReply:
        """Extend the lock's lease to lease_s seconds from now (ok=false, E_STATE when none)."""
        if lease_s <= 0:
            raise ValueError("lease_s must be > 0")
        return self.request(f"{P.AGENT_CMD_RENEW} {max(1, int(lease_s * 1000))}", timeout=timeout)

    def backup(self, timeout: float = TRANSFER_TIMEOUT_S, external: bool = False) -> AgentReply:
        """external: npusim's direct path, metadata only (export the data first, simimages.py)."""
        return self.request(_with_external(P.AGENT_CMD_BACKUP, external), timeout=timeout)

    def restore(self, timeout: float = TRANSFER_TIMEOUT_S, external: bool = False) -> AgentReply:
        """external: re-create allocations without data; the process stays LOCKED until imported."""
        return self.request(_with_external(P.AGENT_CMD_RESTORE, external), timeout=timeout)

    def unlock(self, timeout: float = TRANSFER_TIMEOUT_S) -> AgentReply:
        # An HCCL rank let go while its peers re-form its communicators re-forms them with them
        # (native/npusim/hccl_snapshot.cpp, "The fate of a lock"): bounded by HCCL_CONNECT_TIMEOUT.
        return self.request(P.AGENT_CMD_UNLOCK, timeout=timeout)

    def hccl(self, key: str, value: str, timeout: float = DEFAULT_TIMEOUT_S) -> AgentReply:
        """An HCCL setting for the runtime's next lock or restore (agent.h: rendezvous DIR, alone 1)."""
        if not value or any(c.isspace() for c in value) or len(value) >= P.AGENT_HCCL_VALUE_MAX:
            raise ValueError(f"an HCCL setting's value must be one word under {P.AGENT_HCCL_VALUE_MAX} bytes")
        return self.request(f"{P.AGENT_CMD_HCCL} {key} {value}", timeout=timeout)

    # -- transport ------------------------------------------------------------
    def request(
        self, command: str, timeout: float = DEFAULT_TIMEOUT_S, check: bool = True
    ) -> AgentReply:
        """Sends one request line; returns the reply (raises AgentError on ok=false if check)."""
        raw = self._exchange(command, timeout)
        try:
            reply = AgentReply.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as e:
            raise AgentProtocolError(
                f"unreadable reply from the agent of process {self.pid}: {raw[:200]!r}"
            ) from e
        if check and not reply.ok:
            cls = LockTimeoutError if reply.code == LOCK_TIMEOUT else AgentError
            raise cls(reply, command)
        return reply

    def _exchange(self, command: str, timeout: float) -> str:
        names = agent_sockets(self.pid)
        if names is None:
            # The target's descriptors are hidden from us (another user's process): try the plain
            # name; the credentials check below refuses a squatter, and the agent refuses us.
            names = [agent_socket_name(self.pid)]
        elif not names:
            raise AgentNotFound(self._not_found_message())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout)
            try:
                sock.connect(names[0])
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise AgentNotFound(self._not_found_message()) from e
            except (socket.timeout, BlockingIOError) as e:  # EAGAIN: its queue of connections is full
                raise AgentProtocolError(
                    f"the agent of process {self.pid} did not accept a connection within "
                    f"{self.connect_timeout:g} s (busy with a long backup or restore?)"
                ) from e
            except OSError as e:
                raise AgentProtocolError(f"cannot connect to the agent of process {self.pid}: {e}") from e
            self._check_peer(sock, names[0])
            sock.settimeout(timeout)
            chunks: list[bytes] = []
            try:
                try:
                    sock.sendall(command.encode() + b"\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent may answer (e.g. a refusal) before reading: read it below
                size = 0
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if chunk.endswith(b"\n") or size > MAX_REPLY:
                        break
            except socket.timeout as e:
                raise AgentProtocolError(
                    f"no reply to `{command}` from the agent of process {self.pid} "
                    f"within {timeout:g} s"
                ) from e
            except OSError as e:
                raise AgentProtocolError(
                    f"lost the connection to the agent of process {self.pid}: {e}"
                ) from e
            raw = b"".join(chunks).decode(errors="replace").strip()
            if not raw:
                raise AgentProtocolError(
                    f"the agent of process {self.pid} closed the connection without answering"
                )
            return raw
        finally:
            sock.close()

    def _check_peer(self, sock: socket.socket, name: str) -> None:
        """The listener must be the target itself: SO_PEERCRED holds the credentials the
        kernel took when the socket started listening (a restored agent's are its own)."""
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _ = struct.unpack("3i", raw)
        uids = _uids(self.pid)
        if peer_pid != self.pid or (uids and peer_uid not in uids):
            raise AgentImpostor(
                f"the socket @{name[1:]} belongs to process {peer_pid} (uid {peer_uid}), not to process "
                f"{self.pid}: refusing to talk to it"
            )

    def _not_found_message(self) -> str:
        if not Path(f"/proc/{self.pid}").exists():
            return f"no such process {self.pid}"
        message = f"no npusnap agent is listening in process {self.pid}"
        if _listening_names(None, self.pid):
            message += f" (another process holds @{agent_socket_name(self.pid)[1:]}: ignored)"
        return message


def _with_external(command: str, external: bool) -> str:
    """backup/restore, on npusim's direct path when external."""
    return f"{command} {P.AGENT_ARG_EXTERNAL}" if external else command


_SO_ACCEPTCON = 0x10000  # /proc/net/unix Flags: a listening socket
_SOCK_STREAM = "0001"


def _agent_name_re(pid: int) -> re.Pattern[str]:
    return re.compile(re.escape(agent_socket_name(pid)[1:]) + rf"(-[0-9a-f]{{{P.AGENT_SOCKET_SUFFIX_HEX}}})?")


def _listening_names(inodes: Optional[set[str]], pid: int, netns_of: Optional[int] = None) -> list[str]:
    """Listening stream sockets named like pid's agent in a network namespace's /proc/net/unix
    (netns_of's, else ours), restricted to `inodes` when given; names with their leading NUL."""
    pattern = _agent_name_re(pid)
    where = f"/proc/{netns_of}/net/unix" if netns_of else "/proc/self/net/unix"
    names = []
    try:
        with open(where, encoding="utf-8", errors="replace") as f:
            next(f, None)
            for line in f:
                parts = line.rstrip("\n").split(None, 7)
                if len(parts) < 8 or parts[4] != _SOCK_STREAM:
                    continue
                try:
                    listening = int(parts[3], 16) & _SO_ACCEPTCON
                except ValueError:
                    continue
                if not listening or (inodes is not None and parts[6] not in inodes):
                    continue
                path = parts[7]
                if path.startswith("@") and pattern.fullmatch(path[1:]):
                    names.append("\0" + path[1:])
    except OSError:
        return []
    return sorted(names, key=len)  # the plain name first


def agent_sockets(pid: int) -> Optional[list[str]]:
    """The agent's listening socket names among process pid's own descriptors (leading NUL
    included); None when we may not read its descriptors (another user's process)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return None
    except OSError:
        return []
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link.endswith("]"):
            inodes.add(link[8:-1])
    return _listening_names(inodes, pid, netns_of=pid) if inodes else []


def _uids(pid: int) -> set[int]:
    """The process's real, effective, saved and filesystem uids (empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return {int(x) for x in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


def has_agent(pid: int, library_name: str = AGENT_LIB.name) -> bool:
    """True when the agent library is mapped in the process or the agent answers."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            if any(line.rstrip().endswith("/" + library_name) for line in f):
                return True
    except OSError:
        pass
    try:
        AgentClient(pid, connect_timeout=0.5).request(P.AGENT_CMD_PING, timeout=2.0)
    except AgentProblem:
        return False
    return True


# The one translation of npusnap-inject's exit statuses, as for the agent's codes.
INJECT_STATUS_ERRORS: dict[int, tuple[type[NpusnapError], Optional[str]]] = {
    INJECT_NO_PROCESS: (TargetNotFound, "check the pid with `ps -p PID`"),
    INJECT_PERMISSION: (PermissionProblem, "run as root (or with CAP_SYS_PTRACE), or as the process's owner "
                        "with kernel.yama.ptrace_scope=0"),
    INJECT_DLOPEN_FAILED: (DeviceFailed, "the process could not load the agent library; is it readable there "
                           "(same filesystem view, not a container)?"),
    INJECT_DAMAGED: (DeviceFailed, "the process may be in a bad state; check it and restart it if needed"),
}


def inject(
    pid: int,
    library: Union[str, Path] = AGENT_LIB,
    injector: Union[str, Path] = INJECTOR,
    timeout: float = 20.0,
    ready_timeout: float = 5.0,
) -> AgentReply:
    """Loads the agent into running process ``pid`` and waits until it answers ``ping``.

    Does nothing but ping when the agent is already there.
    """
    if has_agent(pid):
        return _wait_ready(pid, ready_timeout)
    library = Path(library).resolve()
    if not os.access(injector, os.X_OK):
        raise InjectFailed(
            f"the injector {injector} is missing or not executable",
            "reinstall npusnap (pip install .) so the native parts are built",
        )
    try:
        proc = subprocess.run(
            [str(injector), "--timeout", f"{timeout:g}", str(pid), str(library)],
            capture_output=True,
            text=True,
            timeout=timeout + 15,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise InjectFailed(f"the injector did not finish for process {pid}") from e
    if proc.returncode != 0:
        line = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        if line.startswith("npusnap-inject: "):
            line = line[len("npusnap-inject: ") :]
        raise InjectFailed(f"could not inject the agent into process {pid}: {line}", exit_status=proc.returncode)
    return _wait_ready(pid, ready_timeout)


def _wait_ready(pid: int, timeout: float) -> AgentReply:
    deadline = time.monotonic() + timeout
    client = AgentClient(pid, connect_timeout=0.5)
    while True:
        try:
            return client.ping()
        except AgentNotFound:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def agent_error(e: Exception, doing: str) -> NpusnapError:
    """The agent client's (and injector's) errors as the npusnap error kinds the CLI reports:
    each says its kind (AGENT_CODE_ERRORS, INJECT_STATUS_ERRORS)."""
    message = f"{doing} failed: {e}"
    hint = getattr(e, "hint", None)
    if isinstance(e, AgentProblem):
        return e.kind(message, hint)
    return DeviceFailed(message, hint)
