"""Shared fixtures: a private npusim device daemon per test."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from npusnap_cli import native

pytest_plugins = ["tests.cluster.fixtures"]  # the session's test cluster (tests/cluster, tests/job)

_READY_TIMEOUT_S = 10.0


_SUN_PATH_MAX = 107  # sockaddr_un.sun_path, NUL excluded


@dataclass
class NpuSimDaemon:
    """A running npusimd on a private socket. .env carries NPUSIM_SOCKET for child processes."""

    socket: str
    devices: int = 2
    memory: int = 1 << 30
    group: Optional[str] = None  # --group: also serve this group's members
    env: dict = field(default_factory=dict)
    proc: Optional[subprocess.Popen] = None
    npusimd: Path = field(default_factory=lambda: native.NPUSIMD)
    toolkit: Path = field(default_factory=lambda: native.TOOLKIT_HOME)

    def start(self) -> None:
        if not self.npusimd.exists():
            pytest.fail(f"{self.npusimd} is missing: build and install with "
                        "`pip install --no-build-isolation .`")
        # setpriv --pdeathsig: a SIGKILLed pytest takes its daemons with it (nobody else reaps them).
        pdeathsig = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
        self.proc = subprocess.Popen(
            [*pdeathsig, str(self.npusimd), "--socket", self.socket, "--devices", str(self.devices),
             "--memory", str(self.memory), "--foreground", *(["--group", self.group] if self.group else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], _READY_TIMEOUT_S)
        line = self.proc.stdout.readline().strip() if ready else ""
        if line != f"ready {self.proc.pid}":
            self.stop()
            pytest.fail(f"npusimd did not become ready (got {line!r})")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; always reaps."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    @contextlib.contextmanager
    def running(self, monkeypatch: Optional[pytest.MonkeyPatch] = None) -> Iterator["NpuSimDaemon"]:
        """Started for the with-block and always stopped; .env (and, with monkeypatch, our own
        environment) names its socket in NPUSIM_SOCKET."""
        self.env = {**os.environ, "NPUSIM_SOCKET": self.socket}
        if monkeypatch is not None:
            monkeypatch.setenv("NPUSIM_SOCKET", self.socket)
        try:
            self.start()
            yield self
        finally:
            self.stop()


def _socket_dir(tmp_path: Path) -> tuple[Path, Optional[tempfile.TemporaryDirectory]]:
    # Unix socket paths are short; fall back to a private /tmp directory for long test names.
    if len(str(tmp_path / "npusim.sock")) <= _SUN_PATH_MAX:
        return tmp_path, None
    tmp = tempfile.TemporaryDirectory(prefix="npusim-")
    return Path(tmp.name), tmp


@pytest.fixture
def npusim_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NpuSimDaemon]:
    """A private npusimd (2 devices, 1 GiB each); NPUSIM_SOCKET is exported to child processes."""
    directory, cleanup = _socket_dir(tmp_path)
    try:
        with NpuSimDaemon(socket=str(directory / "npusim.sock")).running(monkeypatch) as daemon:
            yield daemon
    finally:
        if cleanup is not None:
            cleanup.cleanup()


@pytest.fixture
def shm() -> Iterator[Path]:
    """A private directory on the tmpfs (a live checkpoint's --live-staging): what is left there
    after a checkpoint is seen."""
    d = Path(tempfile.mkdtemp(prefix="npusnap-test-live-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
