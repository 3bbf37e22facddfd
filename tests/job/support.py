"""Jobs of npusim training ranks on the test cluster, and what tests/job asks of them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from tests.cluster.support import FINISHED, Cluster, poll
from tests.helpers import ROOT, StepGate

TRAIN = ROOT / "examples" / "train.py"
TRAIN_ARGS = ("--dim", "64", "--samples", "128", "--scratch-mb", "1")
STEP = re.compile(r"^step (\d+) ")


def train_argv(steps: int, sleep_ms: int) -> list[str]:
    return ["python", str(TRAIN), "--steps", str(steps), "--sleep-ms", str(sleep_ms), *TRAIN_ARGS]


class RankJob:
    """A batch job of `nodes` x `per_node` npusim training ranks (agent preloaded by `npusnap run`),
    each writing its own rank-T.out in a fresh directory on the shared storage; with gate_at, held
    after that step until self.gate is opened."""

    def __init__(self, c: Cluster, steps: int, sleep_ms: int, per_node: int = 2, nodes: int = 2,
                 gate_at: Optional[int] = None) -> None:
        self.c = c
        self.out = c.shared / f"ranks-{uuid.uuid4().hex[:8]}"
        self.out.mkdir()
        self.count = nodes * per_node
        script = self.out / "ranks.sh"
        self.gate = StepGate(self.out / "gate", -1 if gate_at is None else gate_at)  # -1: never held
        gate = f"export STEP_GATE='{self.gate.env['STEP_GATE']}'\n" if gate_at is not None else ""
        script.write_text("#!/bin/bash\n%ssrun --output=%s/rank-%%t.out --input=none npusnap run -- %s\n"
                          % (gate, self.out, " ".join(train_argv(steps, sleep_ms))))
        script.chmod(0o755)
        self.id = c.sbatch(script, f"--nodes={nodes}", f"--ntasks-per-node={per_node}")

    def rank_file(self, t: int) -> Path:
        return self.out / f"rank-{t}.out"

    def last_step(self, t: int) -> int:
        f = self.rank_file(t)
        steps = [int(m.group(1)) for line in (f.read_text().splitlines() if f.exists() else [])
                 if (m := STEP.match(line))]
        return max(steps, default=-1)

    def wait_steps(self, at_least: int, timeout: float = 90) -> list[int]:
        """Every rank's last step once each has reached at_least."""
        if not poll(lambda: all(self.last_step(t) >= at_least for t in range(self.count)), timeout):
            raise AssertionError(f"ranks of job {self.id} at steps {[self.last_step(t) for t in range(self.count)]}, "
                                 f"not {at_least}; {self.c.output(self.id)[-1500:]}")
        return [self.last_step(t) for t in range(self.count)]

    def assert_all_run_on(self, timeout: float = 60) -> None:
        """Every rank makes progress (it runs, and its device calls are not locked)."""
        before = [self.last_step(t) for t in range(self.count)]
        if not poll(lambda: all(self.last_step(t) > before[t] + 1 for t in range(self.count)), timeout):
            raise AssertionError(f"ranks of job {self.id} stuck: {before} -> "
                                 f"{[self.last_step(t) for t in range(self.count)]}")

    def step_lines(self, t: int) -> list[str]:
        return [line for line in self.rank_file(t).read_text().splitlines()
                if STEP.match(line) or line.startswith("done ")]


def reference(c: Cluster, steps: int) -> list[str]:
    """An uninterrupted run's step lines (the same program on one node of the cluster)."""
    r = c.run("srun", "--nodes=1", "--ntasks=1", *train_argv(steps, 0), timeout=120)
    return [line for line in r.stdout.splitlines() if STEP.match(line) or line.startswith("done ")]


def npusnap(c: Cluster, *args: str, timeout: float = 180, env: Optional[dict[str, str]] = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["npusnap", *args], env={**c.env, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=c.shared)


def as_json(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def wait_finished(c: Cluster, job: str, timeout: float = 120) -> dict[str, Any]:
    return c.wait_state(job, FINISHED, timeout)


def no_checkpoint_left(directory: Path) -> None:
    assert not directory.exists(), f"{directory} exists after an abort"
    left = [p.name for p in directory.parent.glob(f".{directory.name}.*")]
    assert not left, f"left behind: {left}"


def workers(c: Cluster, node: str) -> list[int]:
    """The pids of the job workers running on c's node (for the kill tests). c's only: every test
    cluster on this machine names its nodes node1, node2..., and a concurrent test session's
    workers are not ours to kill (that made another session's test_hccl.py fail, `lost the
    worker on node2`). By SLURM_CONF, which srun passes on to every task (SLURM_CLUSTER_NAME
    is not in the environment of a step started from outside the job)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in cmd and b"job" in cmd and f"SLURMD_NODENAME={node}".encode() in env \
                and f"SLURM_CONF={c.exports['SLURM_CONF']}".encode() in env:
            found.append(int(entry))
    return found


def sigkill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_until(proc: subprocess.Popen[str], pattern: str) -> list[str]:
    """The coordinator's stderr lines up to the first one that matches pattern."""
    assert proc.stderr is not None
    lines: list[str] = []
    while not re.search(pattern, "".join(lines)):
        line = proc.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
    return lines


def coordinator(c: Cluster, target: Path, job: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["npusnap", "job", "checkpoint", "-D", str(target), "--job", job, *args],
                            env={**c.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=c.shared, stdin=subprocess.DEVNULL)


def held_checkpoint(c: Cluster, target: Path, job: str, env: dict[str, str], pattern: str,
                    then: Callable[[], Any]) -> tuple[int, str]:
    """`job checkpoint` held by a test hook (env): once its stderr matches pattern, then() (a kill,
    a cancel); its exit code and its whole stderr. Reaped whatever happens."""
    proc = coordinator(c, target, job, env)
    try:
        lines = read_until(proc, pattern)
        then()
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, "".join(lines) + err


@contextlib.contextmanager
def small_shared_dir(c: Cluster) -> Iterator[Path]:
    """A 4 MiB tmpfs in the shared directory, where a job checkpoint runs out of space (skipped
    where no tmpfs can be mounted); unmounted and removed after."""
    small = c.shared / f"full-{uuid.uuid4().hex[:8]}"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(small)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        small.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield small
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
        small.rmdir()
