"""Helpers for the agent and injector tests: real target processes with a
readiness handshake (always reaped), and small checks on them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional


class Target:
    """A process under test; its stdout goes to a file we can poll."""

    def __init__(
        self,
        argv: list[str],
        out: Path,
        env: Optional[dict[str, str]] = None,
        stdin: Optional[int] = subprocess.DEVNULL,
    ) -> None:
        self.out = out
        self._outf = open(out, "wb")
        self.proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=self._outf,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.restored = False  # after a CRIU restore the pid is no longer our child

    def lines(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines()

    def wait_for(
        self, predicate: Callable[[list[str]], bool], timeout: float = 10.0, what: str = "output"
    ) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines()
            if predicate(lines):
                return lines
            if not self.alive():
                raise AssertionError(f"target exited waiting for {what}: {lines[-5:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {lines[-5:]}")
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 10.0) -> None:
        self.wait_for(lambda ls: any(line.startswith("ready") for line in ls), timeout, "ready")

    def numbers(self) -> list[int]:
        return [int(x) for x in self.lines() if x.strip().isdigit()]

    def wait_numbers_past(self, n: int, timeout: float = 10.0) -> list[int]:
        self.wait_for(lambda ls: len([x for x in ls if x.strip().isdigit()]) > n, timeout, f">{n} numbers")
        return self.numbers()

    def alive(self) -> bool:
        if self.restored:
            return proc_state(self.pid) not in ("gone", "Z")
        return self.proc.poll() is None

    def state(self) -> str:
        return proc_state(self.pid)

    def stop(self) -> None:
        try:
            if self.restored:
                kill_pid(self.pid)
            elif self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)
        finally:
            self._outf.close()


def proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rindex(")") + 2]


PY_LOOP = (
    "import os, sys, time\n"
    "print('ready', os.getpid(), flush=True)\n"
    "i = 0\n"
    "while True:\n"
    "    print(i, flush=True); i += 1\n"
    "    time.sleep(0.05)\n"
)


def python_loop_argv() -> list[str]:
    return [sys.executable, "-u", "-c", PY_LOOP]


def assert_sequence(numbers: list[int]) -> None:
    assert numbers, "no output"
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers


def criu_binary() -> Optional[str]:
    env = os.environ.get("NPUSNAP_CRIU")
    if env:
        return env
    for p in ("/usr/local/sbin/criu", "/usr/sbin/criu"):
        if os.access(p, os.X_OK):
            return p
    return shutil.which("criu")


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while proc_state(pid) not in ("gone", "Z") and time.monotonic() < deadline:
        time.sleep(0.02)


def dump_and_restore(criu: str, t: Target, images: Path) -> None:
    """criu dump (which kills t), reap it, criu restore -d: t.pid lives again, not our child."""
    images.mkdir()
    r = subprocess.run(
        [criu, "dump", "-t", str(t.pid), "-D", str(images), "-o", "dump.log", "-v4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, (images / "dump.log").read_text()[-3000:]
    t.proc.wait(timeout=10)  # reap the dumped process so its pid is free again
    t.restored = True
    r = subprocess.run(
        [criu, "restore", "-D", str(images), "-d", "-o", "restore.log", "-v4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, (images / "restore.log").read_text()[-3000:]
    assert proc_state(t.pid) not in ("gone", "Z", "t", "T")
