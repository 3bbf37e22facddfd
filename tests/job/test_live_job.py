"""`npusnap job checkpoint --live` on the real test cluster: each node's ranks are stopped only
while their images are written to memory (each node's --live-staging), run on, and only then are
their images copied to the shared job checkpoint, sealed and voted on. A live job checkpoint
(the direct data path) commits, verifies and restores bit-identical, lazily (`job restore --lazy`:
every rank runs before its memory is back); each rank's downtime ends before its node's
write-behind starts; a failure in the write-behind aborts the job checkpoint (nothing left, on
the shared storage or in memory) and costs the ranks nothing: they ran on already."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.cluster.support import Cluster
from tests.helpers import rewind_to_checkpoint

from .support import RankJob, as_json, no_checkpoint_left, npusnap, reference, wait_finished
from .test_job import _wrap

ABORTED = 15
STEPS = 40  # at 150 ms a step, held before the last step until the checkpoint is taken (a step gate)


@pytest.fixture
def shm() -> Iterator[Path]:
    """A private tmpfs directory of the test's own, as every node's --live-staging (the test
    cluster's nodes share this machine's memory): what a live checkpoint leaves there shows."""
    d = Path(tempfile.mkdtemp(prefix="npusnap-test-live-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _names(phases: list[dict[str, Any]]) -> list[str]:
    return [p["name"] for p in phases]


def _until(phases: list[dict[str, Any]], name: str) -> float:
    """Seconds of the phases up to and including name."""
    names = _names(phases)
    return sum(p["seconds"] for p in phases[:names.index(name) + 1])


def test_a_live_job_checkpoint_runs_on_before_its_write_behind_and_restores_bit_identical(
        live_cluster: Cluster, shm: Path) -> None:
    c = live_cluster
    want = reference(c, STEPS)
    job = RankJob(c, STEPS, sleep_ms=150, per_node=1, gate_at=STEPS - 2)
    job.wait_steps(3)
    ck = c.shared / f"ck-live-{job.id}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", job.id, "--live", "--live-staging",
                        str(shm), "--data-path", "direct", "--json"))
    assert r["live"] is True and r["left_running"] is True and len(r["ranks"]) == 2, r
    assert r["downtime_s"] == max(x["downtime"] for x in r["ranks"]), r
    for node in r["nodes"]:  # the set's phases: its members ran on before anything reached the shared storage
        names = _names(node["phases"])
        assert names.index("dump") < names.index("resume") < names.index("write-behind") < names.index("seal"), node
        assert node["phases"][names.index("write-behind")]["bytes"] > 0, node
    for x in r["ranks"]:
        assert "resume" in _names(x["phases"]), x
        node = next(n for n in r["nodes"] if n["name"] == x["node"])
        # Both from the set's lock: the rank ran again, unlocked, before its node's write-behind began.
        assert 0 < x["downtime"] <= _until(node["phases"], "resume") + 0.05, (x, node)
    assert not any(shm.iterdir()), list(shm.iterdir())  # the images in memory are given back
    job.wait_steps(min(max(job.last_step(t) for t in range(2)) + 2, job.gate.at))  # they run on
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True
    ins = as_json(npusnap(c, "job", "inspect", str(ck), "--json"))
    assert all(x["downtime"] == y["downtime"] for x, y in zip(ins["ranks"], r["ranks"])), ins

    c.run("scancel", job.id)  # the job ends where it is; restored from the live checkpoint, it finishes
    wait_finished(c, job.id)
    for x in r["ranks"]:  # each rank's output as it was at the checkpoint (it ran on, appending, since)
        node = next(n for n in r["nodes"] if n["name"] == x["node"])
        rewind_to_checkpoint(ck / node["dir"], job.rank_file(x["procid"]), member=x["pid"])
    job.gate.open()
    # Lazily, on the nodes it ran on (the direct path: each rank's environment names its node's daemon).
    order = [n["name"] for n in json.loads(ck.joinpath("job.json").read_text())["nodes"]]
    out = c.shared / f"restore-lazy-{job.id}.json"
    b = c.sbatch(_wrap(c, f"npusnap job restore {ck} --lazy --nodes {','.join(order)} --json > {out}"), "--nodes=2")
    state = wait_finished(c, b)
    assert state["job_state"] == "COMPLETED", c.output(b)
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 0 and sorted(doc["lazy"]) == sorted(order), doc
    assert all(not n["problems"] and n["seconds"] > 0 for n in doc["lazy"].values()), doc
    for t in range(2):
        assert job.step_lines(t) == want, f"rank {t} differs from the uninterrupted run"


def test_a_failed_write_behind_aborts_and_the_ranks_run_on(ranks: RankJob, shm: Path) -> None:
    """The failure comes after every rank ran on (the in-process data path: their device memory
    among the images in memory): the abort removes the job checkpoint and the images in memory,
    and leaves the ranks running."""
    c = ranks.c
    target = c.shared / f"ck-live-fail-{uuid.uuid4().hex[:8]}"
    r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", ranks.id, "--live", "--live-staging", str(shm),
                env={"NPUSNAP_TEST_FAIL": "during:write-behind"})
    assert r.returncode == ABORTED, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("npusnap: error: prepare: the worker on ") and "test failure injected" in last, last
    assert "Traceback" not in r.stderr, r.stderr
    no_checkpoint_left(target)
    assert not any(shm.iterdir()), list(shm.iterdir())
    ranks.assert_all_run_on()


def test_direct_leave_running_ranks_run_on_from_the_committed_job_checkpoint(ranks: RankJob) -> None:
    """Without --live, the direct path's ranks run on after the job's commit, their device memory
    read back from their images: in the committed job checkpoint, not in the staging directory
    the commit renamed (which a worker once looked in, failing every rank's run-on)."""
    c = ranks.c
    ck = c.shared / f"ck-direct-lr-{uuid.uuid4().hex[:8]}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", ranks.id, "--leave-running",
                        "--data-path", "direct", "--json"))
    assert r["live"] is False and all(x["downtime"] > 0 for x in r["ranks"]), r
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True
    ranks.assert_all_run_on()


def test_a_worker_that_fails_after_the_commit_is_reported_and_its_ranks_recovered(ranks: RankJob) -> None:
    """A worker fails once the job checkpoint is committed, before its ranks run on: the command
    says the checkpoint was committed and which worker failed after it (not that nothing was),
    the checkpoint stands, and the worker brings its ranks back from it (they run on)."""
    c = ranks.c
    node = c.nodes[1]
    ck = c.shared / f"ck-late-{uuid.uuid4().hex[:8]}"
    r = npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", ranks.id, "--leave-running", "--data-path",
                "direct", env={"NPUSNAP_TEST_JOB_FAIL": f"done@{node}"})
    assert r.returncode == 3, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"{ck} was committed, but the worker on {node} failed after it" in last, last
    assert "test failure injected" in last and "Traceback" not in r.stderr, r.stderr
    assert "could not be recovered" not in r.stderr, r.stderr
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True
    ranks.assert_all_run_on()


def test_live_with_compress_is_refused_in_one_line(ranks: RankJob) -> None:
    c = ranks.c
    target = c.shared / f"ck-live-zstd-{uuid.uuid4().hex[:8]}"
    r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", ranks.id, "--live", "--compress", "zstd")
    assert r.returncode == 2 and "--live and --compress" in r.stderr and "Traceback" not in r.stderr, r.stderr
    no_checkpoint_left(target)
