"""What the job layer asks Slurm: a job's nodes and their addresses, and the srun line that
starts one worker per node inside the job's allocation (--overlap: beside the running steps)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from typing import Optional, Sequence

from ...errors import EnvironmentProblem, WrongState


def _run(argv: Sequence[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise EnvironmentProblem(f"{argv[0]} is not on PATH", "npusnap job runs on Slurm: install its client "
                                 "commands and set SLURM_CONF")
    r = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if r.returncode != 0:
        raise WrongState(f"{' '.join(argv)} failed: {r.stderr.strip() or r.returncode}",
                         "check the job id with `squeue`")
    return r.stdout


def job_id(given: Optional[str]) -> str:
    """The job to act on: --job, else the allocation we run in (SLURM_JOB_ID)."""
    job = given or os.environ.get("SLURM_JOB_ID")
    if not job:
        raise WrongState("no job given and not inside a Slurm allocation",
                         "pass --job JOBID, or run inside the job (its batch script)")
    if not re.fullmatch(r"[0-9]+", job):
        raise WrongState(f"{job!r} is not a Slurm job id", "a job id is a number, as `squeue` lists it")
    return job


def job_nodes(job: str) -> list[str]:
    """The job's nodes in Slurm's order; refused unless it is running."""
    out = _run(["squeue", "-h", "-j", job, "-o", "%T %N"]).split()
    if len(out) < 2 or out[0] != "RUNNING":
        state = f"is {out[0]}, not RUNNING" if out else "is not running (Slurm does not list it)"
        raise WrongState(f"job {job} {state}", "npusnap job acts on a running job")
    return _run(["scontrol", "show", "hostnames", out[1]]).split()


def job_state(job: str) -> str:
    """The job's state as squeue says it ("" once Slurm no longer knows it)."""
    try:
        out = _run(["squeue", "-h", "-j", job, "-o", "%T"]).split()
    except WrongState:
        return ""
    return out[0] if out else ""


def job_user(job: str) -> tuple[int, int]:
    """The uid and gid the job's tasks run as (its ranks' user)."""
    out = _run(["squeue", "-h", "-j", job, "-o", "%U %G"]).split()
    if len(out) != 2 or not all(x.isdigit() for x in out):
        raise WrongState(f"squeue does not say whose job {job} is ({' '.join(out) or 'nothing'})",
                         "check the job id with `squeue`")
    return int(out[0]), int(out[1])


def node_address(node: str) -> str:
    m = re.search(r"\bNodeAddr=(\S+)", _run(["scontrol", "show", "node", node]))
    return m.group(1) if m else node


def local_address_towards(peer: str) -> str:
    """The address of ours that peer's traffic reaches us on (the route's source address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(peer), 9))  # no packet is sent for a UDP connect
        return str(s.getsockname()[0])


def worker_step(job: str, nodes: Sequence[str], worker_argv: Sequence[str]) -> list[str]:
    """srun: one worker per node of the job, as one more step beside the running ones. The
    step's own tasks are never counted as ranks (the worker knows its own SLURM_STEP_ID)."""
    return ["srun", f"--jobid={job}", "--overlap", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
            "--ntasks-per-node=1", f"--ntasks={len(nodes)}", "--kill-on-bad-exit=0", "--quiet",
            "--mem=0", *worker_argv]
