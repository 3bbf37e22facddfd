"""A job checkpoint taken while, or right after, `npusnap job restore` brings the job's ranks back,
on the real test cluster: a 2-node job of 4 npusim training ranks checkpointed, then LOOPS times
restored in a new allocation and checkpointed again at once: the first time while one node's
restore worker is held before it restores (the checkpoint's worker there waits for the restore to
finish; a restore worker is never taken for a rank: its connection to its coordinator is a TCP
socket CRIU refuses), then as soon as the restore's coordinator says the ranks are restored. Each
checkpoint commits; the last one is restored and run to the end bit-identical to an uninterrupted
run."""

from __future__ import annotations

from tests.cluster.support import Cluster, poll

from .support import RankJob, as_json, npusnap, reference, wait_finished
from .test_job import _wrap

LOOPS = 3
STEPS = 40  # held before the last steps until the loop is done (a step gate)


def test_a_checkpoint_during_or_right_after_each_restore_commits(live_cluster: Cluster) -> None:
    c = live_cluster
    want = reference(c, STEPS)
    job = RankJob(c, STEPS, sleep_ms=100, gate_at=STEPS - 2)
    job.wait_steps(2)
    ck = c.shared / f"rc0-{job.id}"
    as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", job.id, "--json"))
    wait_finished(c, job.id)
    for i in range(1, LOOPS + 1):
        held = f"export NPUSNAP_TEST_JOB_PAUSE=restore@{c.nodes[1]} NPUSNAP_TEST_PAUSE_S=3\n" if i == 1 else ""
        b = c.sbatch(_wrap(c, f"{held}npusnap job restore {ck}"), "--nodes=2")
        # the restore under way (its worker on the second node holds off for 3 s), or just done
        line = f"test pause restore@{c.nodes[1]}" if held else "npusnap job: restored"
        assert poll(lambda: line in c.output(b), 120), c.output(b)[-2000:]  # noqa: B023 (called at once)
        after = c.shared / f"rc{i}-{job.id}"
        r = npusnap(c, "job", "checkpoint", "-D", str(after), "--job", b, "--json")
        assert r.returncode == 0, f"checkpoint {i} {'during' if held else 'right after'} a restore: {r.stderr}"
        assert len(as_json(r)["ranks"]) == 4, r.stdout
        wait_finished(c, b)  # its ranks were killed: the restoring job ends
        ck = after
    job.gate.open()
    last = c.sbatch(_wrap(c, f"npusnap job restore {ck}"), "--nodes=2")
    state = wait_finished(c, last)
    assert state["job_state"] == "COMPLETED" and "the ranks exited 0" in c.output(last), c.output(last)
    for t in range(4):
        assert job.step_lines(t) == want, f"rank {t} differs from the uninterrupted run"
