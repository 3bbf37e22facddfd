"""Driving scripts/test-cluster.sh from tests: a private cluster per test session (its own name,
state directory and /24), the `export` lines it prints as an environment, and the Slurm
commands run against it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "test-cluster.sh"
PROGRAMS = ("ip", "nsenter", "unshare", "munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun",
            "squeue", "scontrol", "scancel", "sinfo")
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
_NET_PREFIX = "10.213"


def missing() -> Optional[str]:
    """Why this machine cannot run the test cluster, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, Slurm's daemons)"
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin"
    absent = [p for p in PROGRAMS if shutil.which(p, path=path) is None]
    if absent:
        return f"needs Slurm and munge ({', '.join(absent)} missing): bash scripts/install-build-deps.sh cluster"
    return None


def free_net() -> str:
    """A 10.213.X /24 no interface uses, starting from one picked by our pid (so two sessions at
    once start apart; the script refuses one already taken, under its lock)."""
    text = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    used = {int(m) for m in re.findall(rf"inet {re.escape(_NET_PREFIX)}\.(\d+)\.", text)}
    start = os.getpid() % 253 + 1
    for i in range(253):
        third = (start + i - 1) % 253 + 1
        if third not in used:
            return f"{_NET_PREFIX}.{third}"
    raise RuntimeError(f"every {_NET_PREFIX}.X.0/24 is in use")


def parse_exports(text: str) -> dict[str, str]:
    """`export NAME=VALUE` / `export NAME="VALUE"` lines as a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.fullmatch(r'export ([A-Z_][A-Z0-9_]*)=(?:"([^"]*)"|(\S*))', line.strip())
        if m:
            out[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
    return out


def poll(done: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Whether done() became true within timeout seconds (checked every interval)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


@dataclass
class Cluster:
    name: str
    dir: Path
    net: str
    exports: dict[str, str] = field(default_factory=dict)

    @property
    def script_env(self) -> dict[str, str]:
        return {**os.environ, "NPUSNAP_CLUSTER_NAME": self.name, "NPUSNAP_CLUSTER_DIR": str(self.dir),
                "NPUSNAP_CLUSTER_NET": self.net, "NPUSNAP": str(Path(sys.executable).parent / "npusnap")}

    @property
    def env(self) -> dict[str, str]:
        """For Slurm's commands: ours without any SLURM_* of an outer job, plus the exports, the venv
        first on PATH (a job inherits it: `python` and `npusnap` there are ours)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "NPUSIM_SOCKET"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', os.defpath)}:/usr/sbin:/sbin"
        return {**env, **self.exports}

    @property
    def nodes(self) -> list[str]:
        return self.exports["NPUSNAP_TEST_NODES"].split()

    @property
    def shared(self) -> Path:
        return Path(self.exports["NPUSNAP_TEST_SHARED"])

    def netns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def address(self, node: str) -> str:
        return f"{self.net}.{10 + int(node.removeprefix('node'))}"

    def npusim_socket(self, node: str) -> str:
        return str(self.dir / "nodes" / node / "npusim" / "daemon.sock")

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SCRIPT), *args], env=self.script_env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def up(self) -> None:
        r = self.script("up")
        if r.returncode != 0:
            raise RuntimeError(f"test-cluster.sh up exited {r.returncode}: {r.stderr.strip()}\n{self.log_tails()}")
        self.exports = parse_exports(r.stdout)

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.script("down")

    def log_tails(self, lines: int = 8) -> str:
        logs = self.dir / "logs"
        parts = []
        for f in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            tail = f.read_text(errors="replace").strip().splitlines()[-lines:]
            parts.append(f"--- {f.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def run(self, *argv: str, timeout: float = 60, check: bool = True,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, cwd=cwd or self.shared)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def sbatch(self, script: Path, *options: str) -> str:
        """Submit script (output to DIR/shared/slurm-J.out); returns the job id."""
        r = self.run("sbatch", "--parsable", f"--output={self.shared}/slurm-%j.out", *options, str(script))
        return r.stdout.strip().split(";")[0]

    def output(self, job_id: str) -> str:
        f = self.shared / f"slurm-{job_id}.out"
        return f.read_text(errors="replace") if f.exists() else ""

    def job(self, job_id: str) -> dict[str, Any]:
        """The job as `squeue --json` describes it (job_state, restart_cnt, nodes, ...), finished
        ones included while slurmctld remembers them (MinJobAge); {} when it does not."""
        r = self.run("squeue", "--json", "--states=all", check=False)
        if r.returncode != 0:
            return {}
        for job in json.loads(r.stdout).get("jobs", []):  # 22.05's --json ignores -j: filter here
            if str(job.get("job_id")) == job_id:
                return dict(job)
        return {}

    def wait_state(self, job_id: str, states: Iterable[str], timeout: float = 60) -> dict[str, Any]:
        wanted = set(states)
        job: dict[str, Any] = {}

        def reached() -> bool:
            job.clear()
            job.update(self.job(job_id))
            return job.get("job_state") in wanted

        if not poll(reached, timeout):
            raise AssertionError(f"job {job_id} is {job.get('job_state')}, not {sorted(wanted)} after "
                                 f"{timeout:.0f} s; output: {self.output(job_id)[-1500:]}")
        return job

    def wait_file_line(self, path: Path, text: str, timeout: float = 60) -> str:
        if not poll(lambda: path.exists() and text in path.read_text(errors="replace"), timeout):
            raise AssertionError(f"{path} has no {text!r} after {timeout:.0f} s")
        return path.read_text(errors="replace")

    def cancel_all(self) -> None:
        """Cancel every job and wait for them to end (so the next test finds idle nodes)."""
        self.run("scancel", "--user", "root", check=False)
        poll(lambda: not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip(), 30)

    def ns_pids(self, ns: str) -> set[int]:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return {int(p) for p in r.stdout.split()}
