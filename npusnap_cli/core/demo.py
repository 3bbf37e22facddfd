"""`npusnap demo`: the whole story on the software NPU, end to end.

Start a device daemon, run a training loop uninterrupted for reference, run it
again under the agent, checkpoint it mid-run, kill it, restart the daemon (a
fresh device), restore it, let it finish, and show that its output equals the
uninterrupted run's, with per-phase timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import native
from ..errors import NpusnapError
from ..image.format import PhaseTiming
from ..platform import simdaemon
from .checkpoint import CheckpointOptions, checkpoint
from .restore import RestoreOptions, restore, wait_exit_code

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "train.py"  # installed beside the package's modules


@dataclass
class DemoResult:
    workdir: Path
    steps: int
    checkpoint_at: int
    identical: bool
    final_line: str
    device_bytes: int
    image_bytes: int
    checkpoint_phases: list[PhaseTiming] = field(default_factory=list)
    restore_phases: list[PhaseTiming] = field(default_factory=list)


def _strip_pid(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith("ready pid")]


def _wait_for(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.startswith(needle) for line in path.read_text().splitlines()):
            return
        if proc.poll() is not None:
            raise NpusnapError(f"the training loop exited early: {path.read_text()[-300:]}")
        time.sleep(0.02)
    raise NpusnapError(f"the training loop did not reach {needle!r} in {timeout:.0f} s")


def run_demo(steps: int = 30, checkpoint_at: int = 10, workdir: Optional[Path] = None,
             say: Callable[[str], None] = lambda m: None) -> DemoResult:
    work = workdir or Path(tempfile.mkdtemp(prefix="npusnap-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    sock = str(work / "npusim.sock")
    env = {**os.environ, "NPUSIM_SOCKET": sock, "LD_PRELOAD": str(native.AGENT_LIB)}
    train = [sys.executable, str(TRAIN), "--steps", str(steps)]
    simdaemon.start(sock, devices=1, memory=1 << 30)
    say(f"device: npusim daemon on {sock}")
    proc: Optional[subprocess.Popen[bytes]] = None
    try:
        say("reference: an uninterrupted training run")
        ref = subprocess.run([*train, "--sleep-ms", "0"], env=env, capture_output=True, text=True, timeout=300)
        if ref.returncode != 0:
            raise NpusnapError(f"the reference run failed: {ref.stderr.strip()[-300:]}")
        out = work / "train.out"
        with open(out, "wb") as f:
            proc = subprocess.Popen([*train, "--sleep-ms", "100"], env=env, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        say(f"training: pid {proc.pid}, weights on the device; checkpointing at step {checkpoint_at}")
        _wait_for(out, f"step {checkpoint_at} ", proc)
        ck = work / "checkpoint"
        m = checkpoint(proc.pid, CheckpointOptions(directory=ck))
        proc.wait(timeout=10)
        say(f"checkpoint: {ck} ({m.device.allocations} device allocations, {m.device.bytes} bytes); process killed")
        simdaemon.stop(sock)
        simdaemon.start(sock, devices=1, memory=1 << 30)
        say("device: daemon restarted (the device is empty)")
        r = restore(RestoreOptions(ck))
        say(f"restore: process {r.pid} is running again; letting it finish")
        code = wait_exit_code(r.pid)
        if code != 0:
            raise NpusnapError(f"the restored training loop exited with {code}: {out.read_text()[-300:]}")
        ours = _strip_pid(out.read_text().splitlines())
        theirs = _strip_pid(ref.stdout.splitlines())
        return DemoResult(work, steps, checkpoint_at, ours == theirs, ours[-1] if ours else "",
                          m.device.bytes, sum(f.size for f in m.files), m.phases, r.phases)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        simdaemon.stop(sock)
