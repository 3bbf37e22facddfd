"""Fixtures for the HCCL tests: hccl_ranks.c built with nothing but `npusnap device env`'s include
and library paths, daemons with a device per rank, and a launcher for N rank processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import pytest

from tests.cann.conftest import _compile, device_env  # noqa: F401  (shared fixture)
from tests.conftest import NpuSimDaemon
from tests.helpers import Workload

HERE = Path(__file__).resolve().parent
RANK_TIMEOUT_S = 60  # bound on any wait for a rank; a passing run takes well under a second


@pytest.fixture(scope="session")
def hccl_ranks(device_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    home = Path(device_env["ASCEND_TOOLKIT_HOME"])
    return _compile(HERE / "hccl_ranks.c", tmp_path_factory.mktemp("hccl-bin") / "hccl_ranks", home,
                    "-O2", "-lhccl", "-lacl_rt", "-lm")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory with a short path (Unix socket paths are short)."""
    d = tempfile.mkdtemp(prefix="hccl-")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemons(short_dir: Path) -> Iterator[Callable[[int], list[NpuSimDaemon]]]:
    """daemons(n): n npusimd instances on sockets of their own, 4 devices each; all stopped after."""
    started: list[NpuSimDaemon] = []

    def start(n: int) -> list[NpuSimDaemon]:
        for _ in range(n):
            d = NpuSimDaemon(socket=str(short_dir / f"d{len(started)}.sock"), devices=4)
            d.env = {**os.environ, "NPUSIM_SOCKET": d.socket}
            started.append(d)
            d.start()
        return started[-n:]

    try:
        yield start
    finally:
        for d in started:
            d.stop()


@dataclass
class Ranks:
    """N rank processes of hccl_ranks, each with its output in a file; stop() reaps them all."""

    exe: Path
    workdir: Path
    ld_path: str
    ranks: list[Workload] = field(default_factory=list)

    def start(self, mode: str, rank: int, nranks: int, daemon: NpuSimDaemon, info: str,
              env: Optional[dict[str, str]] = None, device: Optional[int] = None,
              prefix: Sequence[str] = ()) -> Workload:
        e = {**daemon.env, "LD_LIBRARY_PATH": self.ld_path, **(env or {})}
        argv = [*prefix, str(self.exe), mode, str(rank), str(nranks), str(rank % 4 if device is None else device), info]
        w = Workload(argv, self.workdir / f"rank{len(self.ranks)}.out", env=e)
        self.ranks.append(w)
        return w

    def wait_all(self, timeout: float = RANK_TIMEOUT_S) -> list[list[str]]:
        """Every rank's exit (bounded); asserts each exited 0; returns their output lines."""
        for w in self.ranks:
            try:
                rc = w.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"rank {w.argv[-4]} still running after {timeout}s: {w.lines()[-5:]}") from None
            assert rc == 0, f"rank {w.argv[-4]} exited {rc}: {w.lines()[-10:]}"
        return [w.lines() for w in self.ranks]

    def stop(self) -> None:
        for w in self.ranks:
            w.stop()


@pytest.fixture
def ranks(hccl_ranks: Path, device_env: dict[str, str], short_dir: Path) -> Iterator[Ranks]:  # noqa: F811
    r = Ranks(hccl_ranks, short_dir, device_env["LD_LIBRARY_PATH"])
    try:
        yield r
    finally:
        r.stop()


def free_port() -> int:
    """A TCP port nobody listens on now (for a rank table's root daemon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
