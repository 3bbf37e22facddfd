"""Which processes on this node are the job's ranks: the tasks of the job's steps, found in
/proc by their Slurm environment (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID), the top process
of each task (its children come with its tree), on this node. The worker's own step is never a rank, and
neither is the batch script (it has no step id), nor any job worker (a restore's, whose step is
the job's too: its connection to its coordinator is a TCP socket, and it is no rank of the job).
A restore worker registers its node as restoring before it restores anything, and its ranks once
they are restored: a checkpoint's worker waits for that (wait_restored)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

# Ranks restored into a job keep their old Slurm environment (CRIU brings back their memory):
# the restore worker lists them here, so the next checkpoint of that job finds them.
REGISTRY = Path("/run/npusnap/jobs")


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


def _stat(pid: int, field: int) -> int:
    """Field `field` (1-based, as proc(5) numbers them) of /proc/PID/stat; 0 when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[field - 3])
    except (OSError, IndexError, ValueError):
        return 0


def _ppid(pid: int) -> int:
    return _stat(pid, 4)


def _started(pid: int) -> int:
    return _stat(pid, 22)  # start time: a pid reused since the restore is not the rank


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
    back, restore_step = restored(job, node)
    tasks: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            t = _task(_environ(int(entry)), job, own_step, node)
            if t is not None and t[0] != restore_step:  # the restore worker's step holds no rank of its own
                tasks[int(entry)] = t
    tops = [Rank(pid, *t) for pid, t in tasks.items() if tasks.get(_ppid(pid)) != t and not _job_worker(pid)]
    tops += [r for r in back if r.pid not in tasks]
    return sorted(tops, key=lambda r: (r.step, r.procid, r.pid))


def _job_worker(pid: int) -> bool:
    """Whether pid is an `npusnap job worker` (started through srun as a step of the job)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(argv[i:i + 3] == [b"npusnap_cli", b"job", b"worker"] for i in range(len(argv)))


def _registry(job: str, node: str) -> Path:
    return REGISTRY / f"{job}.{node}.json"


def register_restored(job: str, node: str, ranks: Sequence[Rank], worker_step: Optional[str],
                      restoring: bool = False) -> None:
    """Best effort: without it a restored job can be restored, not checkpointed again. Called by
    the restore worker, whose life (pid and start time) is the entry's: a job id that Slurm hands
    out again later finds the entry stale. restoring: its ranks are not back yet (none listed)."""
    with contextlib.suppress(OSError):
        REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = _registry(job, node).with_suffix(".tmp")
        listed = [{**r.__dict__, "started": _started(r.pid)} for r in ranks]
        worker = {"pid": os.getpid(), "started": _started(os.getpid()), "step": worker_step}
        tmp.write_text(json.dumps({"worker": worker, "ranks": listed, "restoring": restoring}))
        tmp.rename(_registry(job, node))


def unregister_restored(job: str, node: str) -> None:
    with contextlib.suppress(OSError):
        _registry(job, node).unlink()


def _entry(job: str, node: str) -> Optional[dict[str, Any]]:
    """The registry's entry of job on node while its restore worker runs, else None."""
    try:
        d = json.loads(_registry(job, node).read_text())
        worker = d["worker"]
        alive = worker["started"] and _started(int(worker["pid"])) == worker["started"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return d if alive and isinstance(d, dict) else None


def wait_restored(job: str, node: str, timeout: float, say: Callable[[str], None]) -> bool:
    """Wait (at most timeout seconds) while a job restore is bringing job's ranks back on node:
    a checkpoint taken meanwhile would find some ranks or none. False if it still is."""
    deadline = time.monotonic() + timeout
    told = False
    while (e := _entry(job, node)) is not None and e.get("restoring"):
        if time.monotonic() >= deadline:
            return False
        if not told:
            say(f"a job restore is bringing job {job}'s ranks back on {node}: waiting for it")
            told = True
        time.sleep(0.1)
    return True


def restored(job: str, node: str) -> tuple[list[Rank], Optional[int]]:
    """The ranks restored into job on node that still run, and the restore worker's step; nothing
    when that worker no longer runs."""
    try:
        d = _entry(job, node)
        if d is None:
            return [], None
        step = d["worker"].get("step")
        ranks = [(Rank(int(r["pid"]), int(r["step"]), int(r["procid"])), int(r["started"])) for r in d["ranks"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], None
    alive = [r for r, started in ranks if started and _started(r.pid) == started]
    return alive, int(step) if isinstance(step, str) and step.isdigit() else None
