"""Which processes on this node are the job's ranks: the tasks of the job's steps, found in
/proc by their Slurm environment (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID), the top process
of each task (its children come with its tree), on this node. The worker's own step is never a rank, and
neither is the batch script (it has no step id)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Rank:
    pid: int
    step: int
    procid: int

    @property
    def name(self) -> str:
        return f"{self.step}.{self.procid}"


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, eq, v = item.partition(b"=")
        if eq and k.startswith(b"SLURM"):
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _task(env: dict[str, str], job: str, own_step: Optional[str], node: str) -> Optional[tuple[int, int]]:
    if env.get("SLURM_JOB_ID") != job or env.get("SLURMD_NODENAME", node) != node:
        return None
    step, procid = env.get("SLURM_STEP_ID"), env.get("SLURM_PROCID")
    if step is None or procid is None or step == own_step or not step.isdigit() or not procid.isdigit():
        return None
    return int(step), int(procid)


def find_ranks(job: str, node: str, own_step: Optional[str] = None) -> list[Rank]:
    """The job's ranks on this node, ordered by (step, procid). A task names its node
    (SLURMD_NODENAME): where several nodes share one /proc (the test cluster, multiple-slurmd
    mode) only this node's count."""
    tasks: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            t = _task(_environ(int(entry)), job, own_step, node)
            if t is not None:
                tasks[int(entry)] = t
    tops = [Rank(pid, *t) for pid, t in tasks.items() if tasks.get(_ppid(pid)) != t]
    return sorted(tops, key=lambda r: (r.step, r.procid, r.pid))
