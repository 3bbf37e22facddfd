"""Plumbing for the pipeline end-to-end tests: workload command lines, output
comparison, and the checks every test makes on a workload after a phase."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Optional, Sequence

from tests.helpers import ROOT, WORKLOADS, StepGate, Workload, agent_status, npusnap, npusnap_cmd, pid_alive, proc_state  # noqa: F401  (proc_state: re-exported for the tests)

if TYPE_CHECKING:
    from tests.conftest import NpuSimDaemon

TRAIN = ROOT / "examples" / "train.py"
ACL_THREADS_SRC = WORKLOADS / "acl_threads.c"



def train_argv(steps: int, sleep_ms: int, scratch_mb: int = 4) -> list[str]:
    return [sys.executable, str(TRAIN), "--steps", str(steps), "--sleep-ms", str(sleep_ms),
            "--scratch-mb", str(scratch_mb)]


def train_device_bytes(scratch_mb: int = 4, dim: int = 256, samples: int = 1024) -> int:
    """What examples/train.py allocates (every size is already a multiple of 32)."""
    return 2 * samples * dim * 4 + 2 * samples * 4 + 4 * dim * 4 + (scratch_mb << 20)


def attach_argv(steps: int, sleep_ms: int) -> list[str]:
    """A workload started without the agent (tests/workloads/npusim_steps.py)."""
    return [sys.executable, str(WORKLOADS / "npusim_steps.py"), str(steps), str(sleep_ms)]


def under_agent(argv: Sequence[str]) -> list[str]:
    """argv run through `npusnap run --` (the agent preloaded; same pid)."""
    return [*npusnap_cmd(), "run", "--", *argv]


def strip_ready(lines: Sequence[str]) -> list[str]:
    """The output without the `ready pid N` line (the only line that differs between runs)."""
    return [line for line in lines if not line.startswith("ready pid")]


def status(pid: int, env: Optional[dict[str, str]] = None) -> dict:
    doc = agent_status(pid, env)
    assert doc["kind"] == "status" and doc["pid"] == pid
    return doc


def assert_no_checkpoint(directory: Path) -> None:
    """Neither the checkpoint directory nor a `.NAME.partial-*` staging directory exists."""
    assert not directory.exists(), f"{directory} exists after a failed checkpoint"
    leftovers = [p.name for p in directory.parent.iterdir() if p.name.startswith(f".{directory.name}.")]
    assert not leftovers, f"staging leftovers: {leftovers}"


def lines_into(stream: IO[str], q: "queue.Queue[str]") -> None:
    """Each line of stream into q, then "" at its end (a thread's target: reads as they come)."""
    for line in stream:
        q.put(line)
    q.put("")


def interrupt(cli: "subprocess.Popen[str]", delay: float, again_after: Optional[float] = None,
              bound: float = 120) -> str:
    """SIGINT to cli after delay seconds, and its stderr once it exits. again_after: a second
    SIGINT if it still runs that long after the first (one that came after a lazy restore's
    commit is ignored while the memory comes in; the command then waits for the workload, which
    another one stops). One that outlives bound fails the test (with PYTHONFAULTHANDLER set, its
    stacks tell where it hangs); it is killed and reaped on every path."""
    time.sleep(delay)
    cli.send_signal(signal.SIGINT)
    try:
        try:
            _, err = cli.communicate(timeout=bound if again_after is None else again_after)
        except subprocess.TimeoutExpired:
            if again_after is None:
                raise
            cli.send_signal(signal.SIGINT)
            _, err = cli.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        cli.send_signal(signal.SIGABRT)
        _, err = cli.communicate(timeout=30)
        raise AssertionError(f"still running {bound:.0f} s after SIGINT: {err}") from None
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    return err or ""


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("npusnap: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def env_without_preload(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != "LD_PRELOAD"}


def checkpoint_and_restore_after_daemon_restart(w: Workload, daemon: "NpuSimDaemon", ref: Sequence[str], at: int,
                                                directory: Path, gate: StepGate) -> dict:
    """The test of a resource kind: checkpoint the workload w (past step `at` of a steps program,
    whose uninterrupted output is ref, held by gate before its end) into directory, which kills it
    after printing a prefix of ref, restart the daemon, open the gate, restore, and require the
    whole output to be ref. Returns the checkpoint's --json document."""
    r = npusnap("checkpoint", w.pid, "-D", directory, "--json", env=daemon.env)
    assert r.returncode == 0, r.stderr
    doc: dict = json.loads(r.stdout)
    assert doc["device"]["backend"] == "sim"
    assert w.proc.wait(timeout=10) == -signal.SIGKILL and not pid_alive(w.pid)
    at_checkpoint = strip_ready(w.lines())
    assert at < len(at_checkpoint) < len(ref) - 1 and at_checkpoint == list(ref[: len(at_checkpoint)])

    daemon.restart()
    gate.open()
    rs = npusnap("restore", directory, env=daemon.env, timeout=120)
    assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
    assert strip_ready(w.lines()) == list(ref)
    return doc

