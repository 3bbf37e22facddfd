"""Shared test plumbing: run the CLI, start workloads with a readiness handshake,
and always reap what was started."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads"


def npusnap_cmd() -> list[str]:
    exe = shutil.which("npusnap", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "npusnap_cli"]


def npusnap(*args: object, timeout: float = 120, env: Optional[dict[str, str]] = None,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess; returns the completed process (text mode)."""
    proc = subprocess.run([*npusnap_cmd(), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"npusnap {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@functools.lru_cache(maxsize=None)
def criu_works() -> bool:
    try:
        from npusnap_cli.platform.criu import Criu, find_criu

        return Criu(find_criu()).check()[0]
    except Exception:
        return False


requires_criu = pytest.mark.skipif("not __import__('tests.helpers', fromlist=['x']).criu_works()",
                                   reason="needs a working CRIU >= 4.1 (probed with criu check); run scripts/install-criu.sh")


def proc_state(pid: int) -> str:
    """The process's state letter from /proc (R, S, T, Z, ...), or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rpartition(")")[2].split()[0]


def running(pid: int) -> bool:
    """Alive and not stopped: what a rollback must leave a workload."""
    return proc_state(pid) in ("R", "S", "D")


def agent_status(pid: int, env: Optional[dict[str, str]] = None) -> dict:
    """`npusnap status PID --json`, which must succeed."""
    import json

    r = npusnap("status", pid, "--json", env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def kill_and_wait(pid: int, timeout: float = 10) -> None:
    """SIGKILL a process (our child or not) and wait until its pid is free."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.02)


class Workload:
    """A process started with `setsid CMD >out </dev/null` (not a shell job)."""

    def __init__(self, argv: Sequence[str], out: Path, env: Optional[dict[str, str]] = None,
                 cwd: Optional[Path] = None) -> None:
        self.out = out
        self.argv = list(argv)
        with open(out, "wb") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env, cwd=cwd)
        self.pid = self.proc.pid
        self.extra_pids: list[int] = []  # restored incarnations with the same or other pids

    def lines(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines()

    def wait_for_line(self, predicate: "str | int", timeout: float = 30) -> list[str]:
        """Wait until the output holds a line containing predicate (str) or N lines (int)."""
        def holds(lines: list[str]) -> bool:
            if isinstance(predicate, int):
                return len(lines) >= predicate
            return any(predicate in line for line in lines)

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.lines()
            if holds(lines):
                return lines
            if self.proc.poll() is not None and not pid_alive(self.pid):
                lines = self.lines()  # it may have written the line and exited since the read above
                if holds(lines):
                    return lines
                raise AssertionError(f"workload exited early ({self.proc.returncode}): {lines[-5:]}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {predicate!r}; output tail: {self.lines()[-5:]}")

    def wait_exit(self, timeout: float = 60) -> None:
        """Wait for the pid to go away (works for restored processes that are not our children)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is None:
                pass
            if not pid_alive(self.pid):
                self.proc.poll()
                return
            time.sleep(0.05)
        raise AssertionError(f"pid {self.pid} still running after {timeout}s")

    def stop(self) -> None:
        for pid in [self.pid, *self.extra_pids]:
            kill_and_wait(pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class StepGate:
    """Holds a steps workload (tests/workloads/step_gate.h, examples/train.py) after it printed
    step `at` until the test opens the gate: a test that checkpoints it before that step finds it
    running however slow the machine, where a short run would have finished (a zombie, or an
    agent gone); the output stays the uninterrupted run's. Open it before the restore."""

    def __init__(self, path: Path, at: int) -> None:
        self.path, self.at = path, at

    @property
    def env(self) -> dict[str, str]:
        return {"STEP_GATE": f"{self.at}:{self.path}"}

    def open(self) -> None:
        self.path.touch()


def build_c(source: Path, out: Path, *flags: str) -> Path:
    subprocess.run(["cc", "-O2", "-o", str(out), str(source), *flags], check=True)
    return out


def rewind_to_checkpoint(checkpoint: Path, path: Path, member: Optional[int] = None) -> None:
    """Truncate an output file to the size it had at checkpoint time.

    CRIU restores open files by name and refuses one whose size changed since
    the dump; a process left running keeps writing, so before restoring its
    image the file is put back as it was (as a migration would ship it).
    member: the pid of a process set's member whose file it is (criu/PID/)."""
    import pycriu

    images = checkpoint / "criu" / (str(member) if member else "")
    with open(images / "files.img", "rb") as f:
        entries = pycriu.images.load(f)["entries"]
    for e in entries:
        reg = e.get("reg")
        if reg and reg["name"].lstrip("/") == str(path).lstrip("/"):
            # CRIU records no size for a file opened O_APPEND (srun --output's): its offset is the end.
            os.truncate(path, int(reg["size"] if "size" in reg else reg["pos"]))
            return
    raise AssertionError(f"{path} is not open in the checkpoint")


# -- the chunk store (npusnap_cli/image/store.py): chunks live inside packs ------------------

def chunk_place(store: Path, digest: str, codec: str) -> tuple[Path, int, int]:
    """(pack file, offset, stored length) of one chunk, from the store's pack indexes."""
    for idx in sorted((store / "packs").glob("*.idx")):
        for line in idx.read_text().splitlines():
            d, c, offset, stored = line.split()
            if (d, c) == (digest, codec):
                return idx.with_suffix(".pack"), int(offset), int(stored)
    raise AssertionError(f"chunk {digest}.{codec} is not in {store}")


def damage_chunk(store: Path, digest: str, codec: str) -> None:
    """Flip one byte in the middle of a stored chunk."""
    pack, offset, stored = chunk_place(store, digest, codec)
    with open(pack, "r+b") as f:
        f.seek(offset + stored // 2)
        b = f.read(1)
        f.seek(offset + stored // 2)
        f.write(bytes([b[0] ^ 0x01]))


def drop_chunk(store: Path, digest: str, codec: str) -> None:
    """Take a chunk out of the store's index (as if it had been deleted)."""
    pack, _, _ = chunk_place(store, digest, codec)
    idx = pack.with_suffix(".idx")
    idx.write_text("".join(f"{line}\n" for line in idx.read_text().splitlines()
                           if line.split()[:2] != [digest, codec]))


def store_bytes(store: Path) -> int:
    """Bytes of every pack in the store."""
    return sum(p.stat().st_size for p in (store / "packs").glob("*.pack"))
