"""A job checkpoint of HCCL ranks across nodes that ends after the ranks were backed up, on the real
test cluster: the 2 nodes x 2 ranks training job of test_hccl.py, whose one communicator spans
both nodes. Aborted after the backup (a worker failing after its ranks were dumped, or after its
node's set committed; the coordinator failing its commit after every node's set committed), one
node's worker SIGKILLed after its ranks' backup, after their dump (its guardian recovers them, the
coordinator's abort rolls the other node's back: they meet in the attempt's rendezvous
directory), and checkpointed with --leave-running: each time every rank is restored in place and
its communicator re-formed across the nodes through the attempt's one rendezvous directory on the
shared storage, so every rank runs on, unlocked, and the job's losses and final weights are
bit-identical to an uninterrupted run; nothing of an attempt (its staging or rendezvous
directory, a stopped process) is left behind."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from npusnap_cli.core.job.ranks import find_ranks
from tests.cann.conftest import device_env  # noqa: F401  (the fixtures hccl_ranks needs)
from tests.cluster.support import Cluster, poll
from tests.hccl.conftest import hccl_ranks  # noqa: F401

from .support import as_json, held_checkpoint, no_checkpoint_left, npusnap, sigkill, wait_finished, workers
from .test_hccl import HcclJob

STEPS = 2500  # at 30 ms a step the job outlives seven checkpoint attempts (then runs the rest unpaused)
ABORTED = 15

ABORTS = [  # (variable, value with {node} filled in): each after every rank of a node was backed up
    ("NPUSNAP_TEST_JOB_FAIL", "vote@{node}"),  # a worker, its ranks dumped: every node rolls back
    ("NPUSNAP_TEST_JOB_FAIL", "committed@{node}"),  # a worker, its node's set committed: recovered
    ("NPUSNAP_TEST_FAIL", "job-commit"),  # the coordinator, every node's set committed: all recovered
]

# (the worker's stage, the hooks that hold it there: {pid} its node's last rank, {node} its node;
# {peer}, {peer2} the other node's ranks, held too until the file {until} exists; a node backs up
# its ranks at once, so both are held for it to be behind). Killed after the
# lock alone, its guardian unlocks its ranks while the other node's are about to back up (leave the
# communicator) or did already: the attempt's one fate decides for all (native/npusim/
# hccl_snapshot.cpp, "The fate of a lock"): "unlock" (the other node's backup is refused, its ranks
# unlocked) or "reform" (the unlocked ranks re-form the communicator with the restored ones).
HELD = "{until}"
KILLS = [
    ("lock, the other node behind", {"NPUSNAP_TEST_PAUSE": "after:lock@{pid},before:backup@{peer},"
                                                           "before:backup@{peer2}",
                                     "NPUSNAP_TEST_PAUSE_UNTIL": HELD}),
    ("lock, the other node backed up", {"NPUSNAP_TEST_PAUSE": "after:lock@{pid},after:backup@{peer}",
                                        "NPUSNAP_TEST_PAUSE_UNTIL": HELD}),
    ("backup", {"NPUSNAP_TEST_PAUSE": "after:backup@{pid}"}),  # its last rank backed up
    ("dump", {"NPUSNAP_TEST_JOB_PAUSE": "vote@{node}"}),  # its ranks dumped (stopped), not voted
]


def runs_on(job: HcclJob, what: str, more: int = 5) -> None:
    """Every rank makes progress again: it runs, unlocked, and its AllReduce with the other node works."""
    before = [job.last_step(t) for t in range(4)]
    assert poll(lambda: all(job.last_step(t) >= before[t] + more for t in range(4)), 120), \
        f"{what}: ranks stuck at {[job.last_step(t) for t in range(4)]} (from {before}):\n{job.c.output(job.id)[-3000:]}"


def test_hccl_ranks_across_nodes_come_back_from_every_abort_after_backup_bit_identical(
        live_cluster: Cluster, hccl_ranks: Path, device_env: dict[str, str]) -> None:  # noqa: F811
    c = live_cluster
    ld = device_env["LD_LIBRARY_PATH"]
    ref = HcclJob(c, hccl_ranks, ld, sleep_us=0, steps=STEPS)
    state = wait_finished(c, ref.id, timeout=300)
    assert state["job_state"] == "COMPLETED", c.output(ref.id)
    want = [ref.results(t) for t in range(4)]
    assert all(w == want[0] and len(w) == STEPS + 1 for w in want), (want[0][-2:], c.output(ref.id))

    job = HcclJob(c, hccl_ranks, ld, sleep_us=30000, steps=STEPS)
    assert poll(lambda: all(job.last_step(t) >= 5 for t in range(4)), 90), \
        ([job.last_step(t) for t in range(4)], c.output(job.id))
    second = c.nodes[1]  # tasks 2 and 3 (block distribution)
    for stage, hook in KILLS:
        killed_after(job, second, stage, hook)
    for variable, value in ABORTS:
        point = value.format(node=second)
        target = c.shared / f"ck-abort-{uuid.uuid4().hex[:8]}"
        r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", job.id, env={variable: point})
        assert r.returncode == ABORTED or (point == "job-commit" and r.returncode != 0), f"{point}: {r.stderr}"
        assert "test failure injected" in r.stderr.strip().splitlines()[-1] and "Traceback" not in r.stderr, \
            r.stderr + _logs(c)
        assert "could not be recovered" not in r.stderr and "rollback failed" not in r.stderr, \
            r.stderr + "".join(f"\n--- rank {t}\n" + "\n".join(job.lines(t)[-8:]) for t in range(4)) + _logs(c)
        no_checkpoint_left(target)  # neither its staging nor its rendezvous directory
        runs_on(job, point)

    ck = c.shared / f"ck-{job.id}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", job.id, "--leave-running", "--json"))
    assert [x["rank"] for x in r["ranks"]] == [0, 1, 2, 3], r
    assert not list(c.shared.glob(f".{ck.name}.*")), "the attempt's rendezvous directory was left behind"
    runs_on(job, "--leave-running")
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True

    job.finish_fast()
    state = wait_finished(c, job.id, timeout=300)
    assert state["job_state"] == "COMPLETED", c.output(job.id)[-3000:]
    for t in range(4):
        assert job.results(t) == want[t], f"rank {t} differs from the uninterrupted run:\n{job.lines(t)[-5:]}"
        assert job.lines(t)[-1] == "done", job.lines(t)[-3:]


def killed_after(job: HcclJob, node: str, stage: str, hook: dict[str, str]) -> None:
    """node's worker SIGKILLed once its ranks passed stage: the coordinator aborts the other node,
    the killed one's guardian recovers its ranks, and all four meet again within a bounded time.
    With the other node held too: let go once the fate is decided (the guardian's unlock, or the
    other node's backup before the kill)."""
    c = job.c
    ranks = find_ranks(job.id, node)
    assert len(ranks) == 2, ranks
    peer, peer2 = (r.pid for r in find_ranks(job.id, next(n for n in c.nodes if n != node)))
    target = c.shared / f"ck-kill-{uuid.uuid4().hex[:8]}"
    until = c.shared / f"{target.name}.go"
    env = {k: v.format(pid=ranks[-1].pid, node=node, peer=peer, peer2=peer2, until=until) for k, v in hook.items()}
    points = next(iter(env.values())).split(",")
    fate = lambda: list(c.shared.glob(f".{target.name}.rendezvous-*/hccl-fate"))  # noqa: E731

    def kill() -> None:
        sigkill(workers(c, node))
        if HELD in hook.values():  # decided by the guardian's unlock, or already by the backup
            assert poll(lambda: bool(fate()), 60), f"{stage}: no fate decided"
            decided = fate()[0].read_text()
            until.touch()
            assert decided == ("unlock" if "before:backup" in env["NPUSNAP_TEST_PAUSE"] else "reform"), decided

    rc, err = held_checkpoint(c, target, job.id, {**env, "NPUSNAP_TEST_PAUSE_S": "120"},
                              "(?s)" + "".join(f"(?=.*test pause {re.escape(p)})" for p in points), kill)
    until.unlink(missing_ok=True)
    assert rc == ABORTED and f"lost the worker on {node}" in err.strip().splitlines()[-1], \
        f"{stage}: {err}" + _logs(c)
    assert "could not be recovered" not in err and "rollback failed" not in err, err + _ranks(job) + _logs(c)
    try:
        runs_on(job, f"killed after {stage}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{err}" + _ranks(job) + _logs(c)) from None
    stopped = [p for r in find_ranks(job.id, c.nodes[0]) + find_ranks(job.id, node) for p in _tree(r.pid)
               if _state(p) == "T"]
    assert not stopped, f"{stage}: processes left stopped: {stopped}"
    no_checkpoint_left(target)  # the killed worker's guardian removed its node's part, the coordinator the rest
    status = json.loads(npusnap(c, "job", "status", str(target), "--json").stdout)
    assert status["state"] == "absent" and not status["partial"], status


def _tree(pid: int) -> list[int]:
    """pid and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(x) for t in Path(f"/proc/{p}/task").iterdir()
                     for x in (t / "children").read_text().split()]
        except OSError:
            pass
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "gone"


def _ranks(job: HcclJob) -> str:
    return "".join(f"\n--- rank {t}\n" + "\n".join(job.lines(t)[-8:]) for t in range(4))


def _logs(c: Cluster) -> str:
    """The tail of the nodes' slurmd logs, for a failure's message."""
    out = []
    for f in sorted((c.dir / "logs").glob("slurmd-*.log")):
        out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-25:]))
    for f in sorted((c.dir / "logs").glob("npusim-*.log")):
        out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-25:]))
    return "\n" + "\n".join(out)
