"""Plumbing for the examples/ tests: the reference training output, environments for
the shell scripts, and reaping every process a test started (found by a marker in
its environment, which a CRIU-restored process keeps)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Optional

from tests.helpers import ROOT, pid_alive

EXAMPLES = ROOT / "examples"
TRAIN = EXAMPLES / "train.py"
SLURM_LIB = EXAMPLES / "slurm" / "npusnap-slurm.sh"
SBATCH = EXAMPLES / "slurm" / "npusnap-job.sbatch"
PERIODIC = EXAMPLES / "periodic" / "npusnap-periodic.sh"
BIN = Path(sys.executable).parent          # the venv's bin: npusnap, python
MARKER_VAR = "NPUSNAP_EXAMPLES_TEST"


def new_marker() -> str:
    return uuid.uuid4().hex


def script_env(base: dict[str, str], marker: str, **extra: str) -> dict[str, str]:
    """base (with NPUSIM_SOCKET) + the venv first on PATH + the reaping marker + extra."""
    env = {**base, MARKER_VAR: marker, "PATH": f"{BIN}{os.pathsep}{base.get('PATH', os.defpath)}"}
    env.pop("SLURM_CONF", None)
    for k in [k for k in env if k.startswith("SLURM_")]:
        del env[k]
    env.update(extra)
    return env


def train_args(steps: int, sleep_ms: int) -> list[str]:
    """examples/train.py with little device memory (8 MiB of scratch): quick to checkpoint."""
    return [str(TRAIN), "--steps", str(steps), "--sleep-ms", str(sleep_ms), "--scratch-mb", "8"]


def reference_lines(env: dict[str, str], steps: int) -> list[str]:
    """train.py run uninterrupted (no agent, no pause), its output without the pid line."""
    r = subprocess.run([sys.executable, *train_args(steps, 0)], env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-500:]
    return strip_pid(r.stdout.splitlines())


def strip_pid(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def wait_for_line(path: Path, needle: str, timeout: float, alive: Optional[subprocess.Popen] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(needle in line for line in read_lines(path)):
            return
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"exited ({alive.returncode}) before {needle!r} appeared in {path}: "
                                 f"{read_lines(path)[-5:]}")
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} did not appear in {path} within {timeout:.0f} s: {read_lines(path)[-5:]}")


def job_checkpoints(job_dir: Path) -> list[Path]:
    """The checkpoints npusnap-slurm.sh committed in a job's directory, oldest first (each is named
    by its UTC time; hidden names are partial ones and the chunk store)."""
    if not job_dir.is_dir():
        return []
    return sorted(p for p in job_dir.iterdir() if not p.name.startswith(".") and p.is_dir())


def workload_pid(log: Path) -> Optional[int]:
    for line in read_lines(log):
        if line.startswith("ready pid "):
            return int(line.split()[2])
    return None


def marked_pids(marker: str) -> list[int]:
    """Processes (not this one) whose environment carries MARKER_VAR=marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def reap_marked(marker: str, timeout: float = 10) -> None:
    """SIGKILL every process carrying the marker and wait until they are gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in marked_pids(marker) if pid_alive(p)]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.05)


def npusnap_bin() -> str:
    exe = BIN / "npusnap"
    return str(exe) if exe.exists() else "npusnap"
