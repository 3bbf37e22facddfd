"""Plumbing for the fault matrix: workloads, the CLI under a test pause, and the
checks that say a case "ended safe"."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from tests.helpers import ROOT, Workload, kill_and_wait, npusnap_cmd, proc_state  # noqa: F401  (re-exported)
from tests.helpers import agent_status as status  # noqa: F401  (re-exported)

TRAIN = ROOT / "examples" / "train.py"
DOCUMENTED_CODES = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 130}

# examples/train.py preceded by host ballast (so a CRIU dump takes a while) and, optionally,
# a connection to an outside Unix socket (which CRIU refuses as an external socket).
TRAIN_WRAPPER = r"""
import os, runpy, socket, sys
ballast_mb, connect_to = int(sys.argv[1]), sys.argv[2]
ballast = b"\x01" * (ballast_mb << 20)  # touched pages: CRIU has to write them all
if connect_to != "-":
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(connect_to)
sys.argv = [sys.argv[3]] + sys.argv[4:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass
class Reference:
    steps: list[str]

    def check(self, lines: Sequence[str]) -> None:
        """The workload's step lines are exactly the uninterrupted run's, in order."""
        got = [x for x in lines if x.startswith("step ")]
        assert got, "no step lines"
        n = min(len(got), len(self.steps))
        for i in range(n):
            assert got[i] == self.steps[i], f"step line {i} differs: {got[i]!r} != {self.steps[i]!r}"


def train_argv(steps: int = 3000, sleep_ms: int = 30, scratch_mb: int = 4, device: int = 0,
               ballast_mb: int = 0, connect_to: Optional[str] = None) -> list[str]:
    args = [str(TRAIN), "--steps", str(steps), "--sleep-ms", str(sleep_ms),
            "--scratch-mb", str(scratch_mb), "--device", str(device)]
    if ballast_mb or connect_to:
        return [sys.executable, "-c", TRAIN_WRAPPER, str(ballast_mb), connect_to or "-", *args]
    return [sys.executable, *args]


def start_train(tmp: Path, env: dict[str, str], agent: bool = True, name: str = "train",
                agent_log: Optional[Path] = None, **kw: object) -> Workload:
    argv = train_argv(**kw)  # type: ignore[arg-type]
    if agent:
        pre = [*npusnap_cmd(), "run"]
        if agent_log:
            pre += ["--agent-log", str(agent_log)]
        argv = [*pre, "--", *argv]
    w = Workload(argv, tmp / f"{name}.out", env=env)
    try:
        w.wait_for_line("ready pid", timeout=30)
    except BaseException:
        w.stop()
        raise
    return w


def steps(w: Workload) -> int:
    return sum(1 for x in w.lines() if x.startswith("step "))


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("npusnap: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def assert_failed_cleanly(r: subprocess.CompletedProcess, codes: Iterable[int]) -> str:
    codes = set(codes)
    assert codes <= DOCUMENTED_CODES
    assert r.returncode in codes, f"exit {r.returncode}, wanted {sorted(codes)}: {r.stderr}"
    return one_error_line(r.stderr)


def partial_leftovers(directory: Path) -> list[Path]:
    if not directory.parent.is_dir():
        return []
    return [p for p in directory.parent.iterdir() if p.name.startswith(f".{directory.name}.")]


def assert_no_valid_checkpoint(directory: Path, partial_ok: bool = False) -> list[Path]:
    """No manifest at the target, none in a staging directory, and (unless partial_ok) no
    `.NAME.partial-*` leftovers at all. Returns the leftovers."""
    assert not (directory / "manifest.yaml").exists(), f"{directory} looks like a checkpoint"
    left = partial_leftovers(directory)
    for p in left:
        assert not (p / "manifest.yaml").exists(), f"{p} holds a manifest"
    if not partial_ok:
        assert not left, f"staging leftovers: {[p.name for p in left]}"
    return left


def wait_progress(w: Workload, more: int = 3, timeout: float = 15) -> int:
    n0 = steps(w)
    deadline = time.monotonic() + timeout
    while steps(w) < n0 + more:
        assert time.monotonic() < deadline, (
            f"workload {w.pid} made no progress in {timeout} s (state {proc_state(w.pid)}): {w.lines()[-3:]}")
        assert proc_state(w.pid) not in ("gone", "Z"), f"workload exited: {w.lines()[-5:]}"
        time.sleep(0.05)
    return steps(w)


def assert_running_intact(w: Workload, reference: Optional[Reference], env: Optional[dict] = None) -> None:
    """Running (not stopped), unlocked, progressing, and every step line as an uninterrupted run's."""
    assert proc_state(w.pid) not in ("T", "t", "gone", "Z"), proc_state(w.pid)
    doc = status(w.pid, env)
    assert doc["state"] == "RUNNING" and not doc["stopped"], doc
    wait_progress(w)
    if reference is not None:
        reference.check(w.lines())
    bad = [x for x in w.lines() if "Error" in x or "Traceback" in x]
    assert not bad, bad


def wait_recovers(w: Workload, bound: float = 30, env: Optional[dict] = None) -> None:
    """Wait (bounded) until the workload is RUNNING and not stopped, with nobody's help.
    Fails at once when the agent says nothing will unlock it (locked, no lease armed)."""
    from npusnap_cli.platform.agent import AgentClient, AgentNotFound

    deadline = time.monotonic() + bound
    while True:
        st = proc_state(w.pid)
        assert st not in ("gone", "Z"), f"workload died: {w.lines()[-5:]}"
        if st not in ("T", "t"):  # a stopped agent cannot answer: ask only a running one
            try:
                reply = AgentClient(w.pid).status()
                state, left = reply.state, reply.lease_ms_left
            except AgentNotFound:
                state, left = "RUNNING", None
            if state == "RUNNING":
                return
            if left is None:
                raise AssertionError(f"workload is {state} with no lease armed: it stays locked forever")
        assert time.monotonic() < deadline, f"still {st} after {bound} s"
        time.sleep(0.1)


class PausedCli:
    """`npusnap ARGS` with NPUSNAP_TEST_PAUSE=point, waited (bounded) until it pauses there (at
    each of several comma-separated points)."""

    def __init__(self, args: Sequence[object], point: str, env: dict[str, str], timeout: float = 60):
        self.proc = subprocess.Popen([*npusnap_cmd(), *map(str, args)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**env, "NPUSNAP_TEST_PAUSE": point})
        self.stderr = ""
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while not all(f"npusnap: test pause {p}" in self.stderr for p in point.split(",")):  # each of several
            left = deadline - time.monotonic()
            assert left > 0, f"the CLI never paused at {point}: {self.stderr}"
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 4096).decode(errors="replace")
                if not chunk:
                    self.proc.wait(timeout=10)
                    raise AssertionError(f"CLI exited {self.proc.returncode} before {point}: {self.stderr}")
                self.stderr += chunk

    def kill(self) -> None:
        with_suppress_kill(self.proc.pid)
        self.proc.wait(timeout=10)
        for s in (self.proc.stdout, self.proc.stderr):
            if s is not None:
                s.close()


def with_suppress_kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def reap(*workloads: Optional[Workload]) -> None:
    for w in workloads:
        if w is not None:
            w.stop()


__all__ = ["kill_and_wait"]


def before_first_instruction(pid: int) -> bool:
    """Whether `npusnap`'s launcher (native/launcher) is exec'd but has not yet run its first
    instruction, the one that blocks SIGINT. A SIGINT then ends it by the kernel's default
    action before any code of ours runs: a window inside execve that no program can close
    (only a parent can block the signal first), which grows to milliseconds on a loaded CPU."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    blocked = next((x for x in status.splitlines() if x.startswith("SigBlk:")), "SigBlk: 0").split()[1]
    return os.path.basename(exe) == "npusnap" and not int(blocked, 16) & (1 << (signal.SIGINT - 1))
