"""The coordinator <-> worker wire: small JSON lines over TCP, each carrying an HMAC-SHA256 of
its body under the job's secret. The body names the run (a random id per `job` command) and a
sequence number per direction, so a line from another run, a replayed line, or one from
somebody who does not hold the secret is refused and the connection dropped.

The secret is 32 random bytes written by the coordinator to a file only its owner can read
(0600, in the job's 0700 staging directory on the shared storage); a worker gets the file's
path on its command line, never the secret itself."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Optional

from ...errors import PermissionProblem

MAX_LINE = 1 << 20  # a message is small; anything longer is refused unread


class ProtocolError(Exception):
    """A peer sent something that is not a valid message of this run (or went away)."""


def new_secret(path: Path) -> bytes:
    """A fresh secret in path (created 0600, never replacing a file)."""
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def read_secret(path: Path) -> bytes:
    """The secret in path; refused when somebody other than its owner could read it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise PermissionProblem(f"cannot read the job secret {path}: {e.strerror}") from e
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_mode & 0o077:
            raise PermissionProblem(f"the job secret {path} is readable by others (mode {st.st_mode & 0o777:o})",
                                    "it must be 0600; it was not written by npusnap job")
        text = f.read().strip()
    try:
        return bytes.fromhex(text)
    except ValueError as e:
        raise PermissionProblem(f"the job secret {path} is not a secret npusnap wrote") from e


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


class Channel:
    """One authenticated connection. send()/receive() are used by one thread each at most."""

    def __init__(self, sock: socket.socket, key: bytes, run: str) -> None:
        self.sock, self.key, self.run = sock, key, run
        self.sent = 0
        self.received = 0
        self._buf = b""

    def send(self, kind: str, **fields: Any) -> None:
        self.sent += 1
        body = json.dumps({"run": self.run, "seq": self.sent, "type": kind, **fields}, sort_keys=True)
        line = json.dumps({"body": body, "mac": _mac(self.key, body)}) + "\n"
        self.sock.sendall(line.encode())

    def receive(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """The next message; ProtocolError on a bad one, on EOF, or when timeout passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_LINE:
                raise ProtocolError("a message longer than 1 MiB")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError(f"no message within {timeout:.0f} s")
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError as e:
                raise ProtocolError(f"connection lost ({e.strerror or e})") from e
            if not chunk:
                raise ProtocolError("connection closed")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return self._check(line)

    def _check(self, line: bytes) -> dict[str, Any]:
        try:
            outer = json.loads(line)
            body, mac = outer["body"], outer["mac"]
            if not isinstance(body, str) or not isinstance(mac, str):
                raise TypeError
        except (ValueError, KeyError, TypeError) as e:
            raise ProtocolError("a line that is not a message") from e
        if not hmac.compare_digest(mac, _mac(self.key, body)):
            raise ProtocolError("a message with a wrong signature (not signed with this job's secret)")
        msg = json.loads(body)
        if msg.get("run") != self.run:
            raise ProtocolError("a message of another run")
        if msg.get("seq") != self.received + 1:
            raise ProtocolError("a message out of sequence (replayed or lost)")
        self.received += 1
        return dict(msg)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
