"""The multi-node test cluster (scripts/test-cluster.sh) does what `npusnap job` will rely on:
one task per node, each on its own node's name, address and npusim daemon, srun --overlap into
a running job, scancel, --signal=B:USR1, scontrol requeue with SLURM_RESTART_COUNT, a shared
directory, and a `down` that leaves nothing. Real Slurm daemons, real namespaces.

The tests share one session's cluster; test_down_leaves_nothing brings it down and so runs last
of the session (tests/cluster/fixtures.py moves it there)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import pid_alive

from .support import FINISHED, SCRIPT, Cluster

PROBE = Path(__file__).resolve().parent / "node_probe.py"


def batch_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def pid_files(c: Cluster) -> dict[str, str]:
    files = {"munged": c.dir / "munge" / "munged.pid", "slurmctld": c.dir / "ctld" / "slurmctld.pid"}
    files.update({f"slurmd {n}": c.dir / "nodes" / n / "slurmd.pid" for n in c.nodes})
    return {k: f.read_text().strip() for k, f in files.items()}


def test_bad_input_is_one_line_and_exit_2() -> None:
    for args, env in ((["bogus"], {}), (["status"], {"NPUSNAP_CLUSTER_NAME": "No/Such"}),
                      (["status"], {"NPUSNAP_CLUSTER_NET": "192.168.1"})):
        r = subprocess.run(["bash", str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2, (args, env, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("test-cluster: "), r.stderr


def test_up_is_idempotent(cluster: Cluster) -> None:
    before = pid_files(cluster)
    daemons = {n: cluster.run(sys.executable, "-c", "import npusim, sys; print(npusim.daemon_status(sys.argv[1])['pid'])",
                              cluster.npusim_socket(n)).stdout for n in cluster.nodes}
    exports = dict(cluster.exports)
    cluster.up()
    assert cluster.exports == exports
    assert pid_files(cluster) == before, "a second `up` restarted a daemon"
    for n in cluster.nodes:
        again = cluster.run(sys.executable, "-c", "import npusim, sys; print(npusim.daemon_status(sys.argv[1])['pid'])",
                            cluster.npusim_socket(n)).stdout
        assert again == daemons[n], f"{n}'s npusim daemon was restarted"
    status = cluster.script("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert set(cluster.exports) >= {"SLURM_CONF", "NPUSNAP_TEST_NODES", "NPUSNAP_TEST_SHARED"}
    assert len(cluster.nodes) >= 2


def test_batch_job_runs_one_task_per_node_each_on_its_own_node(idle_cluster: Cluster) -> None:
    c = idle_cluster
    out = c.shared / f"probe-{uuid.uuid4().hex[:8]}"
    script = batch_script(c.shared / "probe.sh", f"""\
set -e
echo "batch on $SLURMD_NODENAME socket $NPUSIM_SOCKET"
srun python {PROBE} {out}
# every node sees what every other node wrote to the shared directory
srun --ntasks-per-node=1 sh -c 'echo "$SLURMD_NODENAME sees $(ls {out} | sort | tr "\\n" " ")"'
""")
    job = c.sbatch(script, "--nodes=2", "--ntasks-per-node=1")
    state = c.wait_state(job, FINISHED)
    text = c.output(job)
    assert state["job_state"] == "COMPLETED", text
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert sorted(r["slurmd_nodename"] for r in records) == sorted(c.nodes), text
    daemon_pids = set()
    for r in records:
        node = r["slurmd_nodename"]
        assert r["hostname"] == node, r
        assert r["address"] == c.address(node), r
        assert r["npusim_socket"] == c.npusim_socket(node), r
        assert r["cli_status"].get("socket") == c.npusim_socket(node), r  # npusnap finds it unaided
        assert r["cli_status"].get("pid") == r["daemon_pid"], r
        assert r["round_trip"] is True, r
        daemon_pids.add(r["daemon_pid"])
    assert len(daemon_pids) == len(c.nodes), f"nodes share a daemon: {records}"
    first = c.nodes[0]
    assert f"batch on {first} socket {c.npusim_socket(first)}" in text, text
    both = " ".join(f"{n}.json" for n in sorted(c.nodes))
    for n in c.nodes:
        assert f"{n} sees {both} " in text, text


def test_shared_directory_is_visible_on_every_node(idle_cluster: Cluster) -> None:
    c = idle_cluster
    token = uuid.uuid4().hex
    writer, reader = c.nodes[-1], c.nodes[0]
    c.run("srun", f"--nodelist={writer}", "-N1", "sh", "-c", f"echo {token} > {c.shared}/from-{writer}")
    r = c.run("srun", f"--nodelist={reader}", "-N1", "cat", f"{c.shared}/from-{writer}")
    assert r.stdout.strip() == token
    assert (c.shared / f"from-{writer}").read_text().strip() == token  # and this host sees it too


def test_nodes_reach_this_host_and_each_other_over_tcp(idle_cluster: Cluster) -> None:
    """What a coordinator and its per-node workers (and ranks among themselves) will need."""
    c = idle_cluster
    host = c.exports["NPUSNAP_TEST_HOST_ADDR"]
    addrs = dict(pair.split("=") for pair in c.exports["NPUSNAP_TEST_NODE_ADDRS"].split())
    assert addrs == {n: c.address(n) for n in c.nodes}
    with socket.socket() as listener:
        listener.bind((host, 0))
        listener.listen(len(c.nodes))
        listener.settimeout(60)
        port = listener.getsockname()[1]
        # Each task connects to the next node's slurmd (port 6818), then says hello to this host.
        peers = [addrs[n] for n in c.nodes[1:] + c.nodes[:1]]
        code = ("import os, socket, sys\n"
                "host, port, peers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]\n"
                "socket.create_connection((peers[int(os.environ['SLURM_NODEID'])], 6818), timeout=10).close()\n"
                "with socket.create_connection((host, port), timeout=10) as s:\n"
                "    s.sendall(os.environ['SLURMD_NODENAME'].encode())\n")
        step = subprocess.Popen(["srun", f"--nodes={len(c.nodes)}", "--ntasks-per-node=1", sys.executable,
                                 "-c", code, host, str(port), *peers], env=c.env, cwd=c.shared,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            hellos = {}
            for _ in c.nodes:
                conn, (peer, _port) = listener.accept()
                with conn:
                    hellos[conn.recv(64).decode()] = peer
        finally:
            try:
                _, err = step.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                step.kill()
                _, err = step.communicate()
    assert step.returncode == 0, err
    assert hellos == addrs, hellos  # each came from its own node's address


def test_srun_overlap_into_a_running_job_then_scancel(idle_cluster: Cluster) -> None:
    c = idle_cluster
    script = batch_script(c.shared / "hold.sh", """\
srun --ntasks-per-node=1 sh -c 'echo "step on $SLURMD_NODENAME"; exec sleep 300' &
wait
""")
    job = c.sbatch(script, "--nodes=2", "--ntasks-per-node=1")
    c.wait_state(job, ["RUNNING"])
    c.wait_file_line(c.shared / f"slurm-{job}.out", f"step on {c.nodes[-1]}")
    c.wait_file_line(c.shared / f"slurm-{job}.out", f"step on {c.nodes[0]}")
    # What `npusnap job` does: one more step into the job's allocation while its steps run.
    r = c.run("srun", f"--jobid={job}", "--overlap", "--nodes=2", "--ntasks-per-node=1", "sh", "-c",
              'echo "$SLURM_JOB_ID $SLURMD_NODENAME $(hostname)"')
    assert sorted(r.stdout.split("\n")[:-1]) == sorted(f"{job} {n} {n}" for n in c.nodes), r.stdout
    baseline = {n: c.ns_pids(c.netns(n)) for n in c.nodes}
    c.run("scancel", job)
    c.wait_state(job, ["CANCELLED"])
    sleepers = []
    for n in c.nodes:
        for pid in baseline[n]:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                    sleepers.append(pid)
            except OSError:
                pass
    assert not sleepers, f"job {job}'s tasks still run after scancel: {sleepers}"


def test_signal_usr1_reaches_the_batch_script(idle_cluster: Cluster) -> None:
    c = idle_cluster
    script = batch_script(c.shared / "usr1.sh", """\
trap 'echo "got USR1"; exit 0' USR1
echo started
for i in $(seq 600); do sleep 0.1; done
echo "no signal"
exit 1
""")
    # The signal is due as the job starts (USR1 120 s before a 2-minute limit): Slurm's own
    # --signal path, which `npusnap job` users set up to checkpoint before the limit.
    job = c.sbatch(script, "--nodes=1", "--time=2", "--signal=B:USR1@120")
    state = c.wait_state(job, FINISHED, timeout=90)
    text = c.output(job)
    assert state["job_state"] == "COMPLETED" and "got USR1" in text, text


def test_scontrol_requeue_increments_slurm_restart_count(idle_cluster: Cluster) -> None:
    c = idle_cluster
    log = c.shared / f"requeue-{uuid.uuid4().hex[:8]}.log"
    script = batch_script(c.shared / "requeue.sh", f"""\
echo "run ${{SLURM_RESTART_COUNT:-0}} on $SLURMD_NODENAME" >> {log}
[ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ] && exit 0
for i in $(seq 600); do sleep 0.1; done
exit 1
""")
    job = c.sbatch(script, "--nodes=2", "--ntasks-per-node=1", "--requeue")
    c.wait_file_line(log, "run 0 ")
    c.run("scontrol", "requeue", job)
    state = c.wait_state(job, FINISHED, timeout=60)
    lines = log.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["0", "1"], lines
    assert state["job_state"] == "COMPLETED" and state.get("restart_cnt") == 1, state


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_down_leaves_nothing(cluster: Cluster) -> None:
    c = cluster
    # down with a job still running on every node: its tasks go too
    script = batch_script(c.shared / "left.sh", "srun --ntasks-per-node=1 sleep 300\n")
    job = c.sbatch(script, "--nodes=2", "--ntasks-per-node=1")
    c.wait_state(job, ["RUNNING"])
    namespaces = [c.netns(n) for n in c.nodes] + [f"{c.name}-ctl"]
    pids = set().union(*(c.ns_pids(ns) for ns in namespaces))
    assert pids, "the cluster's namespaces hold no process before down"
    r = c.down()
    assert r.returncode == 0, r.stderr
    alive = [p for p in pids if pid_alive(p)]  # a zombie waits for init, which is not ours
    assert not alive, f"still running after down: {alive}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ns for ns in namespaces if ns in listed.split()], listed
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f" {c.name}-" not in links, links
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(c.dir) not in mounts and not [ns for ns in namespaces if f"/run/netns/{ns} " in mounts], mounts
    addrs = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    assert f"inet {c.net}." not in addrs, addrs
    status = c.script("status")
    assert status.returncode == 3, status.stdout
    assert not (c.dir / "munge").exists() and (c.dir / "logs").is_dir()
