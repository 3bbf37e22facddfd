"""tests/unit: the pipelines driven with fakes (tests/unit/fakes.py). No root, no CRIU, no
ptrace, no daemon: they run as any user, in seconds. Each test's workload is a real process of
ours (so resume, kill and /proc behave for real), reaped whatever happens."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Iterator

import pytest

from .fakes import FakeBackend, FakeCriu, Fakes, Script


@pytest.fixture(autouse=True)
def no_criu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any real CRIU use would fail here: CRIU is off PATH and --criu names nothing."""
    criu = shutil.which("criu")
    if criu is not None:
        path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d != os.path.dirname(criu)]
        monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("NPUSNAP_CRIU", "/nonexistent/criu")


@pytest.fixture(autouse=True)
def signal_handlers() -> Iterator[None]:
    """Python's own SIGINT handling at the start of each test, and whatever a pipeline leaves
    installed (a settled outcome keeps ignoring signals, to the process's exit) undone after it."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.fixture
def workload() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    script = Script()
    f = Fakes(script, FakeBackend(script), FakeCriu(script))
    try:
        yield f
    finally:
        f.criu.reap()
