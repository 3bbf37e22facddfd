"""Fixtures for the pipeline end-to-end tests: the C workload compiled once, a
session-wide reference daemon, and uninterrupted reference outputs cached per
command line (a test's own daemon comes from tests/conftest.py's npusim_daemon)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pytest

from npusnap_cli import native
from tests.conftest import NpuSimDaemon

from .support import ACL_THREADS_SRC, strip_ready


@pytest.fixture(scope="session")
def toolkit() -> Path:
    return native.TOOLKIT_HOME


@pytest.fixture(scope="session")
def acl_threads(toolkit: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/workloads/acl_threads.c, built as a CANN user builds against ASCEND_TOOLKIT_HOME."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("a C compiler is required")
    exe = tmp_path_factory.mktemp("bin") / "acl_threads"
    r = subprocess.run([cc, "-O2", "-Wall", "-Werror", str(ACL_THREADS_SRC), f"-I{toolkit / 'include'}",
                        f"-L{toolkit / 'lib64'}", "-lascendcl", "-lpthread",
                        f"-Wl,-rpath,{toolkit / 'lib64'}", "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


@pytest.fixture(scope="session")
def reference_daemon() -> Iterator[NpuSimDaemon]:
    """A daemon of its own for the uninterrupted reference runs."""
    d = tempfile.mkdtemp(prefix="npusim-ref-")
    try:
        with NpuSimDaemon(socket=os.path.join(d, "npusim.sock")).running() as daemon:
            daemon.env.pop("LD_PRELOAD", None)
            yield daemon
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def reference(reference_daemon: NpuSimDaemon) -> Callable[[Sequence[str]], list[str]]:
    """reference(argv): the output of an uninterrupted run of argv (no agent), `ready pid` line
    removed; each command line runs once per session. Pass the fastest variant (sleep 0): the
    workloads' output does not depend on their sleep."""
    cache: dict[tuple[str, ...], list[str]] = {}

    def run(argv: Sequence[str]) -> list[str]:
        key = tuple(argv)
        if key not in cache:
            r = subprocess.run(list(argv), env=reference_daemon.env, capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, \
                f"reference run {argv[-4:]} failed ({r.returncode}): {r.stdout[-500:]}{r.stderr[-500:]}"
            lines = strip_ready(r.stdout.splitlines())
            assert lines and lines[-1].startswith("done"), lines[-3:]
            cache[key] = lines
        return cache[key]

    return run
