"""`npusnap job` on the real test cluster (tests/cluster): a 2-node job of 4 npusim training ranks
checkpointed, killed and restored (swapped nodes, then checkpointed again and restored on the
same nodes) bit-identical to an uninterrupted run; the shape refused; the inspect/verify/status
views. Real Slurm, real CRIU, real daemons."""

from __future__ import annotations

import json

from tests.cluster.support import Cluster, poll

from .support import RankJob, as_json, held_checkpoint, no_checkpoint_left, npusnap, reference, wait_finished

STEPS = 40  # at 150 ms a step, held before the last step until both checkpoints are taken (a step gate)


def test_checkpoint_kill_restore_swapped_then_same_nodes_bit_identical(live_cluster: Cluster) -> None:
    c = live_cluster
    want = reference(c, STEPS)
    job = RankJob(c, STEPS, sleep_ms=150, gate_at=STEPS - 2)  # both checkpoints find the ranks running
    job.wait_steps(3)
    ck1 = c.shared / f"ck1-{job.id}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck1), "--job", job.id, "--json"))
    assert r["kind"] == "job-checkpoint" and len(r["ranks"]) == 4, r
    assert [s["name"] for s in r["stages"]] == ["connect", "prepare", "commit", "finish"], r
    assert sorted({x["node"] for x in r["ranks"]}) == sorted(c.nodes), r
    assert [x["rank"] for x in r["ranks"]] == [0, 1, 2, 3], r
    for x in r["ranks"]:  # each rank's own stage timings, then its node's vote and commit
        assert {"lock", "backup", "dump"} <= {p["name"] for p in x["phases"]}, x
        assert [p["name"] for p in x["phases"]][-2:] == ["vote", "commit"], x
    wait_finished(c, job.id)  # its ranks were killed: the job ends
    stopped_at = [job.last_step(t) for t in range(4)]
    assert all(s < STEPS - 1 for s in stopped_at), stopped_at

    status = as_json(npusnap(c, "job", "status", str(ck1), "--json"))
    assert status["state"] == "committed" and status["ranks"] == 4, status
    assert as_json(npusnap(c, "job", "verify", str(ck1), "--json"))["valid"] is True
    inspect = as_json(npusnap(c, "job", "inspect", str(ck1), "--json"))
    assert {n["name"] for n in inspect["nodes"]} == set(c.nodes), inspect
    assert all(x["device"].get("backend") == "sim" for x in inspect["ranks"]), inspect

    # The wrong shape: one node for a checkpoint of two.
    one = c.sbatch(_wrap(c, f"npusnap job restore {ck1}"), "--nodes=1")
    wait_finished(c, one)
    text = c.output(one)
    assert "the job checkpoint has 4 ranks on 2 nodes (2/2 per node); the new allocation has 1 node(s)" in text, text
    assert "Traceback" not in text, text

    # Restored on swapped nodes in a new allocation; checkpointed again mid-run.
    first = json.loads(ck1.joinpath("job.json").read_text())["nodes"][0]["name"]
    other = next(n for n in c.nodes if n != first)
    b = c.sbatch(_wrap(c, f"npusnap job restore {ck1} --nodes {other},{first}"), "--nodes=2")
    c.wait_state(b, ["RUNNING"])
    # Every rank restored and let go (a rank held at the gate since the first checkpoint shows no new step).
    assert poll(lambda: "npusnap job: restored" in c.output(b), 120), c.output(b)[-1500:]
    job.wait_steps(min(max(stopped_at) + 3, job.gate.at))
    ck2 = c.shared / f"ck2-{job.id}"
    r2 = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck2), "--job", b, "--json"))
    assert len(r2["ranks"]) == 4, r2
    moved = {x["procid"]: x["node"] for x in r["ranks"]}
    assert {x["procid"]: x["node"] for x in r2["ranks"]} == {p: other if n == first else first
                                                              for p, n in moved.items()}, (r, r2)
    wait_finished(c, b)
    job.gate.open()

    # Restored on the nodes it was checkpointed on (the first one's ranks back where they were).
    again = json.loads(ck2.joinpath("job.json").read_text())["nodes"][0]["name"]
    c3 = c.sbatch(_wrap(c, f"npusnap job restore {ck2} --nodes {again},"
                           f"{next(n for n in c.nodes if n != again)}"), "--nodes=2")
    state = wait_finished(c, c3)
    assert state["job_state"] == "COMPLETED", c.output(c3)
    assert "the ranks exited 0" in c.output(c3), c.output(c3)
    for t in range(4):
        assert job.step_lines(t) == want, f"rank {t} differs from the uninterrupted run"


def _wrap(c: Cluster, command: str):  # type: ignore[no-untyped-def]
    script = c.shared / f"restore-{abs(hash(command)) % 10**8}.sh"
    script.write_text(f"#!/bin/bash\n{command}\n")
    script.chmod(0o755)
    return script


def test_a_job_that_ends_during_its_checkpoint_is_named_as_the_cause(live_cluster: Cluster) -> None:
    """The job is cancelled while its checkpoint is held before the lock on every node: Slurm ends
    the job and every step of it, the workers' too; the coordinator's one error line says that the
    job ended (not only that it lost a worker), and nothing is left behind."""
    c = live_cluster
    job = RankJob(c, steps=100000, sleep_ms=100)
    job.wait_steps(2)
    target = c.shared / f"ck-ended-{job.id}"
    rc, err = held_checkpoint(c, target, job.id, {"NPUSNAP_TEST_PAUSE": "before:lock", "NPUSNAP_TEST_PAUSE_S": "120"},
                              "test pause before:lock", lambda: c.run("scancel", job.id))
    last = err.strip().splitlines()[-1]
    assert rc == 15 and f"job {job.id} ended meanwhile (C" in last, err  # CANCELLED, COMPLETING
    assert "Traceback" not in err, err
    wait_finished(c, job.id)
    no_checkpoint_left(target)
