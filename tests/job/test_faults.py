"""A job checkpoint that fails anywhere before its commit is aborted on every node: every rank
runs on, unlocked, and no job checkpoint (nor its staging directory) exists. One worker failing
at each stage, the coordinator failing just before its commit, a worker SIGKILLed mid-checkpoint,
the coordinator SIGKILLed at each stage, the shared directory full, a second job checkpoint of the
same job refused while one runs, a message from another user without the job's secret, and (last:
it costs that node's ranks their device) a node's npusim daemon dying. Real Slurm, CRIU and daemons.
`ranks`, the long job every test here tries to checkpoint, is tests/job/conftest.py's."""

from __future__ import annotations

import encodings.idna  # noqa: F401 - loaded before the fork: the other user cannot read the stdlib under /root
import json
import re
import shutil
import socket
import subprocess
import uuid
from typing import Any

import pytest

from tests.cluster.fixtures import ensure_up
from tests.cluster.support import Cluster, poll
from tests.users import as_user, other_user

from .support import RankJob, coordinator, no_checkpoint_left, npusnap, read_until, sigkill, small_shared_dir, workers

ABORTED = 15
BUSY = 11  # WrongState: another job checkpoint of the job runs
STORAGE = 12


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
        sigkill(workers(c, node))
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


def kill_at(proc: subprocess.Popen[str], pattern: str) -> None:
    """SIGKILL the coordinator once its stderr says pattern; reaped either way."""
    try:
        read_until(proc, pattern)
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


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


def no_workers_left(c: Cluster, timeout: float = 90) -> None:
    """Every job worker has ended (it holds its node's job checkpoint lock while it runs)."""
    assert poll(lambda: not any(workers(c, n) for n in c.nodes), timeout), {n: workers(c, n) for n in c.nodes}


# (stage, the test hook that holds the checkpoint there, the line that says it is there); the
# coordinator is SIGKILLed there: the workers notice it gone at their next word with it.
COORDINATOR_KILLS = [
    ("connect", {}, r"job worker \S+: ranks "),  # a worker found its ranks, its hello on the way
    ("lock", {"NPUSNAP_TEST_JOB_PAUSE": "lock@{node}"}, r"test pause lock@"),
    ("backup", {"NPUSNAP_TEST_PAUSE": "before:backup"}, r"test pause before:backup"),
    ("dump", {"NPUSNAP_TEST_PAUSE": "before:dump"}, r"test pause before:dump"),
    ("vote", {"NPUSNAP_TEST_JOB_PAUSE": "vote@{node}"}, r"test pause vote@"),
    ("commit", {"NPUSNAP_TEST_JOB_PAUSE": "committed@{node}"}, r"test pause committed@"),
    ("job-commit", {"NPUSNAP_TEST_PAUSE": "job-commit"}, r"test pause job-commit"),
]


@pytest.mark.parametrize("stage,hook,line", COORDINATOR_KILLS, ids=[k[0] for k in COORDINATOR_KILLS])
def test_the_coordinator_killed_at_each_stage_every_rank_runs_on(ranks: RankJob, stage: str,
                                                                  hook: dict[str, str], line: str) -> None:
    c = ranks.c
    node = node_of(ranks, 3)
    target = c.shared / f"ck-ckill-{stage}-{uuid.uuid4().hex[:8]}"
    env = {k: v.format(node=node) for k, v in hook.items()}
    go = c.shared / f"go-{uuid.uuid4().hex[:8]}"  # a pipeline pause (NPUSNAP_TEST_PAUSE) ends at the kill
    kill_at(coordinator(c, target, ranks.id, {**env, "NPUSNAP_TEST_PAUSE_S": "3", "NPUSNAP_TEST_PAUSE_UNTIL": str(go)}),
            line)
    go.touch()
    try:
        no_workers_left(c)  # each undid its ranks and ended: none waits for a lease forever
        ranks.assert_all_run_on(timeout=90)
        assert not target.exists(), f"{stage}: {target} exists without a commit"
        status = json.loads(npusnap(c, "job", "status", str(target), "--json").stdout)
        assert status["state"] == "absent", status  # the truth: nothing committed,
        assert status["partial"] and all(n.startswith(f".{target.name}.partial-") for n in status["partial"]), status
        # ... and the dead coordinator's staging directory left over (prune's to remove)
        verify = npusnap(c, "job", "verify", str(target))
        assert verify.returncode != 0 and "Traceback" not in verify.stderr, verify.stderr
    finally:
        for left in target.parent.glob(f".{target.name}.*"):  # the dead coordinator's staging
            shutil.rmtree(left, ignore_errors=True)


def test_a_second_job_checkpoint_is_refused_while_one_runs(ranks: RankJob) -> None:
    c = ranks.c
    node = node_of(ranks, 3)
    first_dir = c.shared / f"ck-first-{uuid.uuid4().hex[:8]}"
    second_dir = c.shared / f"ck-second-{uuid.uuid4().hex[:8]}"
    go = c.shared / f"go-{uuid.uuid4().hex[:8]}"  # ends the first one's pause once the second was refused
    point = f"after:dump@{rank_pid(ranks, 3)}"  # the last rank dumped, its node's vote not sent
    first = coordinator(c, first_dir, ranks.id, {"NPUSNAP_TEST_PAUSE": point, "NPUSNAP_TEST_PAUSE_S": "120",
                                                 "NPUSNAP_TEST_PAUSE_UNTIL": str(go)}, "--leave-running")
    try:
        lines = read_until(first, f"test pause {point}")  # every node's worker holds the job's lock
        r = npusnap(c, "job", "checkpoint", "-D", str(second_dir), "--job", ranks.id)
        go.touch()
        _, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert r.returncode == BUSY, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("npusnap: error: ") and f"another `npusnap job checkpoint` of job {ranks.id}" in last, last
    assert "Traceback" not in r.stderr, r.stderr
    no_checkpoint_left(second_dir)
    assert first.returncode == 0, "".join(lines) + err  # the first one was not disturbed
    doc = json.loads((first_dir / "job.json").read_text())
    for x in doc["ranks"]:  # each rank's own stage timings, as --json reports them (docs/json.md)
        assert [p["name"] for p in x["phases"]][-2:] == ["vote", "commit"], x
        assert {"lock", "backup", "dump"} <= {p["name"] for p in x["phases"]}, x
        assert all(p["seconds"] >= 0 for p in x["phases"]), x
    paused = [x for x in doc["ranks"] if x["node"] != node]  # their node's vote waited for the paused one
    assert paused and all(x["phases"][-2]["seconds"] > 0 for x in paused), doc["ranks"]
    ranks.assert_all_run_on()


def test_the_shared_directory_full_aborts_with_a_storage_problem(ranks: RankJob) -> None:
    c = ranks.c
    with small_shared_dir(c) as small:
        target = small / "ck"
        r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", ranks.id)
        assert r.returncode == STORAGE, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("npusnap: error: prepare: the worker on ") and "no space left" in last.lower(), last
        assert "Traceback" not in r.stderr, r.stderr
        no_checkpoint_left(target)
        assert not any(small.iterdir()), list(small.iterdir())  # no partial checkpoint, valid-looking or not
        ranks.assert_all_run_on()


def test_a_node_daemon_dying_aborts_the_other_nodes_ranks_run_on(ranks: RankJob) -> None:
    """Last in this file: the ranks of the node whose npusim daemon dies lose their device (as on
    real hardware whose driver died); the job checkpoint aborts and the other node's ranks run on.
    The daemon is started again for the tests after this one (ensure_up)."""
    c = ranks.c
    node = node_of(ranks, 3)
    target = c.shared / f"ck-daemon-{uuid.uuid4().hex[:8]}"
    st = npusnap(c, "device", "status", "--socket", c.npusim_socket(node), "--json")
    daemon = int(json.loads(st.stdout)["pid"])
    proc = coordinator(c, target, ranks.id, {"NPUSNAP_TEST_PAUSE": "before:backup", "NPUSNAP_TEST_PAUSE_S": "5"})
    try:
        read_until(proc, r"test pause before:backup")  # every rank is locked
        sigkill([daemon])
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    try:
        assert proc.returncode == ABORTED, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("npusnap: error: ") and node in last, err
        assert "Traceback" not in err, err
        no_checkpoint_left(target)
        others = [t for t in range(ranks.count) if node_of(ranks, t) != node]
        before = {t: ranks.last_step(t) for t in others}
        assert poll(lambda: all(ranks.last_step(t) > before[t] + 1 for t in others), 60), \
            f"the ranks of the other node stuck: {before}"
    finally:
        ensure_up(c)  # a fresh daemon on the node for the tests that come after
