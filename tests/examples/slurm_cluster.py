"""A private one-node Slurm (munged + slurmctld + slurmd on 127.0.0.1) under a temporary
directory, for testing examples/slurm/ for real.

Nothing system-wide is used or changed: its own munge key and socket, slurm.conf,
state and spool directories, free TCP ports; clients find it through SLURM_CONF.
Stopping it cancels its jobs, stops the daemons and kills every process that carries
its marker (jobs and what they started), then removes the directory.

When the Slurm or munge programs are missing and we are root with apt-get, they are
installed (`apt-get install slurm-wlm munge`: about 30 s with a warm mirror); set
NPUSNAP_TEST_NO_APT=1 to skip instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from .support import MARKER_VAR, reap_marked

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
PACKAGES = ("slurm-wlm", "munge")
_install_tried: list[str] = []     # the reason, when an install already failed in this session


def missing_programs() -> list[str]:
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin"
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def ensure_installed() -> Optional[str]:
    """None when Slurm and munge are there (installing them if we may), else why not."""
    missing = missing_programs()
    if not missing:
        return None
    if _install_tried:
        return _install_tried[0]
    why = f"Slurm/munge programs missing ({', '.join(missing)})"
    if os.environ.get("NPUSNAP_TEST_NO_APT"):
        reason = f"{why} and NPUSNAP_TEST_NO_APT is set: apt-get install -y {' '.join(PACKAGES)}"
    elif os.geteuid() != 0 or shutil.which("apt-get") is None:
        reason = (f"{why}; installing them needs root and apt-get (Debian/Ubuntu): "
                  f"apt-get install -y {' '.join(PACKAGES)}")
    else:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            for cmd, limit in ((["apt-get", "update", "-q"], 300),
                               (["apt-get", "install", "-y", "-q", *PACKAGES], 600)):
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit,
                                   stdin=subprocess.DEVNULL)
                if r.returncode != 0:
                    tail = (r.stderr or r.stdout).strip().splitlines()[-1:]
                    raise RuntimeError(f"`{' '.join(cmd)}` exited {r.returncode}: {' '.join(tail)}")
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            reason = f"{why}, and installing {' '.join(PACKAGES)} failed: {e}"
        else:
            still = missing_programs()
            reason = f"still missing after apt-get install: {', '.join(still)}" if still else ""
    if reason:
        _install_tried.append(reason)
        return reason
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    def __init__(self, marker: str) -> None:
        self.marker = marker
        # Short: munged's socket path must fit in sockaddr_un.
        self.dir = Path(tempfile.mkdtemp(prefix="npusnap-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, str] = {}

    def _write_config(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(mode=0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        cpus = os.cpu_count() or 1
        self.conf.write_text(f"""\
ClusterName=npusnaptest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays a requeued job's next start (default 120 s)
AuthInfo=socket={d}/munge/munge.sock,cred_expire=5
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmctldDebug=info
SlurmdDebug=info
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=500 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.dir / "log" / f"{name}.out", "wb") as out:
            self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)

    def start(self, timeout: float = 30) -> None:
        self._write_config()
        d = self.dir
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), MARKER_VAR: self.marker}
        self.env["PATH"] = self.env.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin"
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={d}/munge/munge.key",
                               f"--socket={d}/munge/munge.sock", f"--pid-file={d}/munge/munged.pid",
                               f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge/munged.seed"])
        self._wait(lambda: (d / "munge" / "munge.sock").exists(), timeout, "munged did not create its socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._spawn("slurmd", ["slurmd", "-D"])
        self._wait(self._node_idle, timeout, "the node did not become idle")

    def _node_idle(self) -> bool:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}): {self.log_tail(name)}")
        r = self.run("sinfo", "-h", "-o", "%T", check=False)
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def _wait(self, ok, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} within {timeout:.0f} s: {self.log_tail('slurmctld')} | {self.log_tail('slurmd')}")

    def log_tail(self, name: str, lines: int = 5) -> str:
        text = ""
        for f in (self.dir / "log" / f"{name}.log", self.dir / "log" / f"{name}.out"):
            if f.exists():
                text += f.read_text(errors="replace")
        return " / ".join(text.strip().splitlines()[-lines:])

    def run(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
        kw.setdefault("env", self.env)
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o`, as a dict (JobState, Restarts, ...)."""
        r = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        fields: dict[str, str] = {}
        for word in r.stdout.split():
            k, _, v = word.partition("=")
            fields.setdefault(k, v)
        return fields

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons, kill whatever carries the marker; always."""
        try:
            if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
                self.run("scancel", "--user", "root", check=False)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    r = self.run("squeue", "-h", "-o", "%i", check=False)
                    if r.returncode != 0 or not r.stdout.strip():
                        break
                    time.sleep(0.2)
        finally:
            for name in ("slurmd", "slurmctld", "munged"):
                p = self.procs.get(name)
                if p is None:
                    continue
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
            reap_marked(self.marker)        # slurmstepd, batch shells, workloads
            shutil.rmtree(self.dir, ignore_errors=True)
