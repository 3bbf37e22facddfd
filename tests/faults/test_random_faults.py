"""Signals at random moments, not only at phase boundaries: SIGINT, and SIGSTOP followed
by SIGCONT (Ctrl-Z, a frozen cgroup), sent to `npusnap checkpoint` and `npusnap restore`
after a seeded random delay, over both data paths, default and --leave-running.

Every trial ends in one of two outcomes:
- success reported, and a checkpoint that verifies (a restore: the workload runs, unlocked);
- failure reported in one line with a documented exit code, no valid-looking directory
  (a restore: the restored tree is gone and the checkpoint verifies and restores again),
  and the workload running, unlocked, with its data.
Never a process of the tree left stopped, nor orphaned.

Counts: NPUSNAP_FAULT_SIGINT and NPUSNAP_FAULT_SIGSTOP (small by default; `make faults`
runs 100 and 20), NPUSNAP_FAULT_SEED to replay a run (the seed is printed).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import Workload, npusnap, npusnap_cmd, requires_criu, rewind_to_checkpoint

from .conftest import NOTES
from .support import (
    DOCUMENTED_CODES,
    Reference,
    assert_running_intact,
    before_first_instruction,
    one_error_line,
    partial_leftovers,
    proc_state,
    train_argv,
    wait_recovers,
)

pytestmark = [requires_criu, pytest.mark.criu]

SEED = int(os.environ.get("NPUSNAP_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
COUNTS = {"SIGINT": int(os.environ.get("NPUSNAP_FAULT_SIGINT") or 12),
          "SIGSTOP": int(os.environ.get("NPUSNAP_FAULT_SIGSTOP") or 6)}
# (operation, checkpoint mode, data path, flags); a restore trial restores a default-mode checkpoint.
# --dedup: the trials' checkpoints share one chunk store (their directory's), which runs killed
# while packing must leave usable for the next.
COMBOS = [("checkpoint", "default", "direct", ("--dedup",)), ("checkpoint", "leave-running", "in-process", ()),
          ("restore", "default", "direct", ()), ("checkpoint", "leave-running", "direct", ("--dedup",)),
          ("checkpoint", "default", "in-process", ()), ("restore", "default", "in-process", ())]
LEASE = 1.0  # SIGSTOP trials: pauses up to 3 s outlast it, so fencing is exercised


@dataclass
class Loop:
    """One workload carried from trial to trial: checkpointed (killed or left running),
    restored, or untouched when a trial failed."""
    base: Path
    daemon: NpuSimDaemon
    tag: str
    w: Optional[Workload] = None
    running: bool = False
    ready: dict[str, Path] = field(default_factory=dict)  # data path -> a checkpoint of w, w not running
    seconds: dict[str, float] = field(default_factory=lambda: {"checkpoint": 1.5, "restore": 1.0})
    n: int = 0
    results: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**self.daemon.env, "NPUSNAP_TEST_TAG": self.tag}

    def directory(self) -> Path:
        self.n += 1
        return self.base / f"ck{self.n}"

    def workload(self) -> Workload:
        """The workload, running."""
        if self.w is not None and self.running:
            return self.w
        self.reset()
        self.n += 1
        argv = [*npusnap_cmd(), "run", "--", *train_argv(100000, 30, scratch_mb=2)]
        self.w = Workload(argv, self.base / f"train{self.n}.out", env=self.env)
        self.w.wait_for_line("ready pid", timeout=60)
        self.running = True
        return self.w

    def checkpoint_to_restore(self, data_path: str) -> Path:
        """A default-mode checkpoint of the workload, the workload gone (made now if needed)."""
        if data_path in self.ready and not self.running:
            return self.ready[data_path]
        w = self.workload()
        d = self.directory()
        t = time.monotonic()
        r = npusnap("checkpoint", w.pid, "-D", d, "--data-path", data_path, env=self.env)
        assert r.returncode == 0, r.stderr
        self._learn("checkpoint", time.monotonic() - t)
        wait_gone(w.pid)
        self.running = False
        self.ready = {data_path: d}
        return d

    def _learn(self, op: str, seconds: float) -> None:
        self.seconds[op] = 0.7 * self.seconds[op] + 0.3 * seconds

    def reset(self) -> None:
        if self.w is not None:
            self.w.stop()
        self.w, self.running, self.ready = None, False, {}


def wait_gone(pid: int, bound: float = 15) -> None:
    deadline = time.monotonic() + bound
    while True:
        try:
            os.waitpid(pid, os.WNOHANG)  # the first incarnation is our child
        except ChildProcessError:
            pass
        if proc_state(pid) == "gone":
            return
        assert time.monotonic() < deadline, f"process {pid} still there ({proc_state(pid)}) after {bound} s"
        time.sleep(0.05)


def tagged(tag: str) -> dict[int, tuple[str, int]]:
    """pid -> (state, ppid) of every live process whose environment carries our tag."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"NPUSNAP_TEST_TAG={tag}".encode() not in (d / "environ").read_bytes().split(b"\0"):
                continue
            fields = (d / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            found[int(d.name)] = (fields[0], int(fields[1]))
    return found


def assert_nothing_stray(loop: Loop) -> None:
    """No process of ours is stopped, and none is left but the workload (CLI, guardian and CRIU
    are gone; nothing CRIU froze was left behind): bounded wait for stragglers to exit."""
    keep = {loop.w.pid} if loop.w is not None and loop.running else set()
    deadline = time.monotonic() + 10
    while True:
        found = tagged(loop.tag)
        stopped = {p: s for p, s in found.items() if s[0] in ("T", "t")}
        stray = {p: s for p, s in found.items() if p not in keep}
        if not stopped and not stray:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"seed {SEED}: stopped {stopped}, stray {stray}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    base = Path(tempfile.mkdtemp(prefix="npusnap-faults-"))
    daemon = NpuSimDaemon(socket=str(base / "npusim.sock"))
    daemon.start()
    daemon.env = {**os.environ, "NPUSIM_SOCKET": daemon.socket}
    state = Loop(base=base, daemon=daemon, tag=uuid.uuid4().hex)
    print(f"\nrandom faults: seed {SEED} (NPUSNAP_FAULT_SEED={SEED} replays it)", file=sys.stderr)
    try:
        yield state
    finally:
        state.reset()
        for pid in tagged(state.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
        summary = ", ".join(f"{r}: {state.results.count(r)}" for r in sorted(set(state.results)))
        NOTES.append(f"random faults (seed {SEED}): {len(state.results)} trials; {summary}")


def _fault(proc: subprocess.Popen, kind: str, delay: float, pause: float) -> tuple[bool, bool]:
    """Send the fault after delay; (False, _) when the CLI had already finished, (_, True) when
    the SIGINT was sent before the launcher's first instruction (support.before_first_instruction)."""
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False, False
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
    if proc.poll() is not None:
        return False, False
    if kind == "SIGINT":
        early = before_first_instruction(proc.pid)
        proc.send_signal(signal.SIGINT)
        return True, early
    proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(pause)
    finally:
        proc.send_signal(signal.SIGCONT)
    return True, False


def _trial(loop: Loop, reference: Reference, kind: str, i: int) -> str:
    rng = random.Random(f"{SEED}:{kind}:{i}")
    op, mode, data_path, flags = COMBOS[i % len(COMBOS)]
    if op == "checkpoint":
        w = loop.workload()
        target = loop.directory()
        args = ["checkpoint", w.pid, "-D", target, "--data-path", data_path, *flags]
        args += ["--leave-running"] if mode == "leave-running" else []
        args += ["--lease", str(LEASE)] if kind == "SIGSTOP" else []
    else:
        target = loop.checkpoint_to_restore(data_path)
        assert loop.w is not None
        w = loop.w
        args = ["restore", "-d", target]
    delay = rng.uniform(0.0, loop.seconds[op])
    pause = rng.uniform(0.2, 3.0)
    what = f"seed {SEED} trial {kind}#{i}: {op} {mode} {data_path} {' '.join(flags)}, delay {delay:.3f} s" + (
        f", stopped {pause:.2f} s" if kind == "SIGSTOP" else "")
    start = time.monotonic()
    cli = subprocess.Popen([*npusnap_cmd(), *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=loop.env)
    try:
        landed, early = _fault(cli, kind, delay, pause)
        out, err = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.send_signal(signal.SIGCONT)
            cli.kill()
            cli.communicate()
    if not landed:
        loop._learn(op, time.monotonic() - start)
    rc = cli.returncode
    if rc == -signal.SIGINT and not err and early:
        # Inside execve, before the launcher's first instruction: the kernel's default action, before
        # any code of ours runs (a parent alone could block the signal). Nothing was done. Counted apart.
        assert not (target / "manifest.yaml").exists() or op == "restore"
        assert not partial_leftovers(target) or op == "restore"
        if op == "restore":
            assert proc_state(w.pid) == "gone", f"{what}: restore killed while starting, yet {w.pid} exists"
        else:
            assert_running_intact(w, reference, loop.daemon.env)
        assert_nothing_stray(loop)
        return "interrupted inside execve, before npusnap's first instruction"
    assert rc == 0 or rc in DOCUMENTED_CODES, f"{what}: exit {rc}: {err}"
    assert "Traceback" not in err, f"{what}: {err}"
    outcome = "success" if rc == 0 else f"failed {rc}"
    if op == "checkpoint":
        if rc == 0:
            assert npusnap("verify", target, env=loop.env).returncode == 0, f"{what}: does not verify: {err}"
            if mode == "default":
                wait_gone(w.pid)
                loop.running, loop.ready = False, {data_path: target}
            else:
                assert_running_intact(w, reference, loop.daemon.env)
        else:
            one_error_line(err)
            assert not (target / "manifest.yaml").exists(), f"{what}: failed but {target} looks valid"
            for p in partial_leftovers(target):
                assert not (p / "manifest.yaml").exists(), f"{what}: {p} looks valid"
            wait_recovers(w, bound=LEASE + 30, env=loop.daemon.env)
            assert_running_intact(w, reference, loop.daemon.env)
    else:
        if rc == 0:
            loop.running, loop.ready = True, {}
            assert_running_intact(w, reference, loop.daemon.env)
        else:
            one_error_line(err)
            wait_gone(w.pid)  # the rollback (or the guardian) took the half-restored tree away
            assert npusnap("verify", target, env=loop.env).returncode == 0, f"{what}: checkpoint spoiled"
            rewind_to_checkpoint(target, w.out)
            r = npusnap("restore", "-d", target, env=loop.env)
            assert r.returncode == 0, f"{what}: not restorable again: {r.stderr}"
            loop.running, loop.ready = True, {}
            assert_running_intact(w, reference, loop.daemon.env)
    assert_nothing_stray(loop)
    return outcome if landed else "finished before the fault"


@pytest.mark.parametrize("kind,i", [(k, i) for k in ("SIGINT", "SIGSTOP") for i in range(COUNTS[k])],
                         ids=lambda v: str(v))
def test_random_fault(loop: Loop, reference: Reference, kind: str, i: int) -> None:
    try:
        outcome = _trial(loop, reference, kind, i)
    except BaseException:
        loop.reset()  # the next trial starts from a fresh workload
        raise
    loop.results.append(f"{kind} {outcome}")
