"""A shell job on a real terminal: an interactive bash on a pty runs a workload with `&`;
npusnap, typed at that shell, checkpoints it (--shell-job) and restores it onto the same
terminal, where it writes again. On that shared terminal npusnap draws no live display
(no hidden cursor, no lines redrawn over the job's output)."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import kill_and_wait, npusnap_cmd, pid_alive, requires_criu

pytestmark = requires_criu

TICKER = "import itertools, time\nfor i in itertools.count():\n    print(f'tick {i}', flush=True)\n    time.sleep(0.1)\n"
# What a live display writes: hide/show the cursor, move up, erase a line.
CURSOR_CONTROL = (b"\x1b[?25l", b"\x1b[?25h", b"\x1b[1A", b"\x1b[2K")


class PtyShell:
    """An interactive bash whose terminal is a pty we hold the other end of."""

    def __init__(self) -> None:
        env = {**os.environ, "PS1": "$ ", "TERM": "xterm", "COLUMNS": "120", "HISTFILE": "/dev/null"}
        self.pid, self.master = pty.fork()
        if self.pid == 0:  # the child: bash, session leader with the pty as its terminal
            os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
        self.seen = b""

    def say(self, line: str) -> int:
        """Type a line; returns where its output starts in self.seen."""
        mark = len(self.seen)
        os.write(self.master, line.encode() + b"\n")
        return mark

    def wait_for(self, pattern: bytes, since: int = 0, timeout: float = 60) -> "re.Match[bytes]":
        deadline = time.monotonic() + timeout
        while True:
            found = re.compile(pattern).search(self.seen, since)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} on the terminal; last output: {self.seen[-400:]!r}")
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # bash is gone
                    raise AssertionError(f"the shell exited; last output: {self.seen[-400:]!r}") from None

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.master)


@pytest.fixture
def shell() -> Iterator[PtyShell]:
    sh = PtyShell()
    try:
        sh.wait_for(rb"\$ ")
        yield sh
    finally:
        sh.close()


def _ticks(data: bytes) -> list[int]:
    return [int(n) for n in re.findall(rb"tick (\d+)\r\n", data)]


def test_shell_job_is_checkpointed_and_restored_onto_its_terminal(shell: PtyShell, tmp_path: Path) -> None:
    ticker = tmp_path / "ticker.py"
    ticker.write_text(TICKER)
    ck = tmp_path / "ck"
    npusnap = " ".join(shlex.quote(a) for a in npusnap_cmd())
    pids: list[int] = []
    try:
        mark = shell.say(f"{shlex.quote(sys.executable)} {ticker} & echo PID=$!")
        pid = int(shell.wait_for(rb"PID=(\d+)", mark).group(1))
        pids.append(pid)
        shell.wait_for(rb"tick 3\r\n", mark)

        # Checkpoint from the job's own terminal; the job runs on and writes on.
        mark = shell.say(f"{npusnap} checkpoint {pid} -D {ck} --shell-job --leave-running; echo CK=$?")
        done = shell.wait_for(rb"CK=(\d+)", mark)
        assert done.group(1) == b"0", shell.seen[mark:]
        during = shell.seen[mark:done.start()]
        assert not [c for c in CURSOR_CONTROL if c in during], during
        last = _ticks(shell.seen)[-1]
        shell.wait_for(rf"tick {last + 3}\r\n".encode(), mark)

        kill_and_wait(pid)  # the job ends; its pid is free for the restore
        assert not pid_alive(pid)
        # Restore, typed at the same shell, in the foreground as a person would.
        mark = shell.say(f"{npusnap} restore {ck}; echo RS=$?")
        shell.wait_for(rb"restored process \d+", mark)
        after = shell.wait_for(rb"restored process \d+; waiting for it to exit\r\n", mark).end()
        shell.wait_for(rb"(tick \d+\r\n.*){5}", after)  # the restored job writes to this terminal again
        assert pid_alive(pid)
        ticks = _ticks(shell.seen[after:])
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # one job, counting on from its image
        assert not [c for c in CURSOR_CONTROL if c in shell.seen[mark:]], shell.seen[mark:]
        kill_and_wait(pid)
        assert shell.wait_for(rb"RS=(\d+)", after).group(1) == b"137"  # restore passed the job's death on
    finally:
        for p in pids:
            kill_and_wait(p)
