"""A job checkpoint that fails anywhere before its commit is aborted on every node: every rank
runs on, unlocked, and no job checkpoint (nor its staging directory) exists. One worker failing
at each stage, the coordinator failing just before its commit, a worker SIGKILLed mid-checkpoint,
and a message from another user without the job's secret. Real Slurm, CRIU and daemons."""

from __future__ import annotations

import encodings.idna  # noqa: F401 - loaded before the fork: the other user cannot read the stdlib under /root
import json
import re
import socket
import subprocess
import uuid
from typing import Any, Iterator

import pytest

from tests.cluster.fixtures import ensure_up
from tests.cluster.support import Cluster
from tests.users import as_user, other_user

from .support import RankJob, no_checkpoint_left, npusnap, sigkill, workers

ABORTED = 15


@pytest.fixture(scope="module")
def ranks(cluster: Cluster) -> Iterator[RankJob]:
    """One long job of 4 ranks (2 per node) that every fault test here tries to checkpoint."""
    ensure_up(cluster)
    job = RankJob(cluster, steps=100000, sleep_ms=50)
    try:
        job.wait_steps(2)
        yield job
    finally:
        cluster.cancel_all()


def rank_pid(job: RankJob, t: int) -> int:
    m = re.search(r"ready pid (\d+)", job.rank_file(t).read_text())
    assert m, job.rank_file(t).read_text()
    return int(m.group(1))


def node_of(job: RankJob, t: int) -> str:
    return job.c.nodes[t // 2]  # block distribution: tasks 0,1 on the first node, 2,3 on the second


FAULTS = [  # (variable, value with {pid} / {node} filled in, what fails)
    ("NPUSNAP_TEST_JOB_FAIL", "lock@{node}", "a worker before its ranks are locked"),
    ("NPUSNAP_TEST_FAIL", "after:lock@{pid}", "a rank's lock"),
    ("NPUSNAP_TEST_FAIL", "before:dump@{pid}", "a rank's CRIU dump"),
    ("NPUSNAP_TEST_JOB_FAIL", "vote@{node}", "a worker after the dumps, before its vote"),
    ("NPUSNAP_TEST_JOB_FAIL", "committed@{node}", "a worker after its node's set committed"),
    ("NPUSNAP_TEST_FAIL", "job-commit", "the coordinator just before its commit"),
]


@pytest.mark.parametrize("variable,value,what", FAULTS, ids=[f[1].split("@")[0] for f in FAULTS])
def test_a_failure_at_each_stage_aborts_every_rank_runs_on(ranks: RankJob, variable: str, value: str,
                                                           what: str) -> None:
    c = ranks.c
    point = value.format(pid=rank_pid(ranks, 3), node=node_of(ranks, 3))
    target = c.shared / f"ck-fault-{uuid.uuid4().hex[:8]}"
    r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", ranks.id, env={variable: point})
    assert r.returncode != 0, f"{what}: {r.stderr}"
    if variable != "NPUSNAP_TEST_FAIL" or point != "job-commit":
        assert r.returncode == ABORTED, f"{what}: {r.returncode} {r.stderr}"
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("npusnap: error: ") and "test failure injected" in last, f"{what}: {r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    no_checkpoint_left(target)
    ranks.assert_all_run_on()


def test_a_worker_killed_mid_checkpoint_aborts_within_the_deadline(ranks: RankJob) -> None:
    c = ranks.c
    node = node_of(ranks, 3)
    target = c.shared / f"ck-kill-{uuid.uuid4().hex[:8]}"
    coordinator = subprocess.Popen(
        ["npusnap", "job", "checkpoint", "-D", str(target), "--job", ranks.id, "--prepare-timeout", "60"],
        env={**c.env, "NPUSNAP_TEST_JOB_PAUSE": f"vote@{node}", "NPUSNAP_TEST_PAUSE_S": "120"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.shared, stdin=subprocess.DEVNULL)
    try:
        lines = read_until(coordinator, f"test pause vote@{node}")  # its ranks are dumped, it is about to vote
        sigkill(workers(node))
        _, err = coordinator.communicate(timeout=60)  # the loss is noticed at once, far within 60 s
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.communicate()
    err = "".join(lines) + err
    assert coordinator.returncode == ABORTED, err
    assert f"lost the worker on {node}" in err.strip().splitlines()[-1], err
    no_checkpoint_left(target)
    ranks.assert_all_run_on(timeout=90)  # the killed worker's ranks: its guardian and the agents' lease


def read_until(proc: subprocess.Popen[str], pattern: str) -> list[str]:
    """The coordinator's stderr lines up to the first one that matches pattern."""
    assert proc.stderr is not None
    lines: list[str] = []
    while not re.search(pattern, "".join(lines)):
        line = proc.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
    return lines


def _attack(address: str, pattern: str) -> dict[str, Any]:
    """As another user: read the job's secret, then talk to the coordinator without it."""
    import glob

    out: dict[str, Any] = {}
    try:
        secret = glob.glob(pattern)
        out["secret_readable"] = bool(secret) and bool(open(secret[0]).read())
    except PermissionError:
        out["secret_readable"] = False
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        body = '{"node": "node1", "run": "0", "seq": 1, "type": "hello", "ranks": []}'
        s.sendall(('{"body": %s, "mac": "%s"}\n' % (json.dumps(body), "0" * 64)).encode())
        s.settimeout(10)
        out["answer"] = s.recv(100).decode()  # "" once the coordinator dropped us
    return out


def test_a_message_without_the_job_secret_is_refused(ranks: RankJob) -> None:
    c = ranks.c
    target = c.shared / f"ck-secret-{uuid.uuid4().hex[:8]}"
    first = node_of(ranks, 0)
    coordinator = subprocess.Popen(
        ["npusnap", "job", "checkpoint", "-D", str(target), "--job", ranks.id, "--leave-running"],
        env={**c.env, "NPUSNAP_TEST_JOB_PAUSE": f"lock@{first}", "NPUSNAP_TEST_PAUSE_S": "4"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.shared, stdin=subprocess.DEVNULL)
    try:
        lines = read_until(coordinator, r"listening on (\S+)")
        m = re.search(r"listening on (\S+)", "".join(lines))
        assert m
        got = as_user(other_user(), _attack, m.group(1), f"{c.shared}/.{target.name}.partial-*/secret")
        out, err = coordinator.communicate(timeout=120)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.communicate()
    err = "".join(lines) + err
    assert got == {"secret_readable": False, "answer": ""}, got
    assert "refused a connection from" in err and "wrong signature" in err, err
    assert coordinator.returncode == 0, err  # the job's own workers were not disturbed
    assert (target / "job.json").is_file()
    ranks.assert_all_run_on()
