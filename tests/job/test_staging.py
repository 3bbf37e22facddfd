"""`npusnap job checkpoint --stage DIR` on the real test cluster: each node's ranks dumped into a
node-local directory first, then copied to the shared job checkpoint before the node votes.
A staged checkpoint commits, verifies and restores bit-identical, also with the chunk store
(--dedup, --compress) and as the child of another (--parent); with --leave-running the ranks
run on before the copy (from the phases: their downtime ends before their write-behind starts);
the shared directory filling up during the write-behind aborts (exit 12), every rank runs on and
nothing is left, locally or shared, as when the coordinator is lost during the write-behind; an unsafe DIR is refused in one line (exit 5). `ranks`, the
long job that the tests leaving it running share, is tests/job/conftest.py's."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from tests.cluster.support import Cluster
from tests.users import other_user

from .support import RankJob, as_json, no_checkpoint_left, npusnap, reference, small_shared_dir, wait_finished
from .test_faults import coordinator, kill_at, no_workers_left
from .test_job import _wrap

PERMISSION = 5
STORAGE = 12
STEPS = 40


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    """A node-local staging directory (the test cluster's nodes share this machine's files)."""
    d = tmp_path / "stage"
    d.mkdir(0o700)
    return d


def _names(rank: dict) -> list[str]:  # type: ignore[type-arg]
    return [p["name"] for p in rank["phases"]]


def test_a_staged_checkpoint_commits_verifies_and_restores_bit_identical(live_cluster: Cluster,
                                                                        stage: Path) -> None:
    c = live_cluster
    want = reference(c, STEPS)
    job = RankJob(c, STEPS, sleep_ms=150, gate_at=STEPS - 2)  # held before its end until checkpointed
    job.wait_steps(3)
    ck = c.shared / f"ck-staged-{job.id}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", job.id, "--stage", str(stage), "--json"))
    assert r["stage"] == str(stage) and len(r["ranks"]) == 4, r
    for x in r["ranks"]:  # its own stages, its node's copy to the shared storage, then the vote
        assert {"lock", "backup", "dump"} <= set(_names(x)) and _names(x)[-3:] == ["write-behind", "vote", "commit"], x
        assert x["phases"][-3]["bytes"] > 0 and x["downtime"] is None, x  # stopped: no downtime to report
    assert not any(stage.iterdir()), list(stage.iterdir())  # the local copies are gone
    wait_finished(c, job.id)
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True
    back = c.shared / f"restore-staged-{job.id}.sh"
    back.write_text(f"#!/bin/bash\nnpusnap job restore {ck}\n")
    back.chmod(0o755)
    job.gate.open()
    restoring = c.sbatch(back, "--nodes=2")
    done = wait_finished(c, restoring)
    assert done["job_state"] == "COMPLETED", c.output(restoring)
    for t in range(4):
        assert job.step_lines(t) == want, f"rank {t} differs from the uninterrupted run"


def test_staged_with_the_chunk_store_and_a_parent_verifies_and_restores_bit_identical(live_cluster: Cluster,
                                                                                     stage: Path) -> None:
    """--stage with --dedup (in-process data path), --compress (direct) and --parent (a child of the
    compressed one): each node's chunks are copied from its node-local store into the job's shared
    one, the parent is named from the shared copy; each verifies, the child restores bit-identical."""
    c = live_cluster
    want = reference(c, STEPS)
    job = RankJob(c, STEPS, sleep_ms=150, per_node=1, gate_at=STEPS - 2)  # held until all three are taken
    job.wait_steps(3)
    cks = {name: c.shared / f"ck-staged-{name}-{job.id}" for name in ("dedup", "compress", "parent")}
    runs = [("dedup", ["--dedup", "--leave-running"]),
            ("compress", ["--compress", "zstd", "--data-path", "direct", "--leave-running"]),
            ("parent", ["--parent", str(cks["compress"]), "--compress", "zstd"])]
    for name, extra in runs:
        r = as_json(npusnap(c, "job", "checkpoint", "-D", str(cks[name]), "--job", job.id, "--stage", str(stage),
                            *extra, "--json"))
        assert len(r["ranks"]) == 2 and all(_names(x)[-3] == "write-behind" for x in r["ranks"]), (name, r)
        assert not any(stage.iterdir()), (name, list(stage.iterdir()))  # the local copies and store are gone
        ins = as_json(npusnap(c, "job", "inspect", str(cks[name]), "--json"))
        assert all(v for v in ins["node_stored_bytes"].values()), (name, ins)  # chunks in the shared store
        if name != "parent":
            job.wait_steps(min(max(job.last_step(t) for t in range(2)) + 2, job.gate.at))
    wait_finished(c, job.id)  # the last one stopped its ranks: the job ends
    for name, ck in cks.items():
        assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True, name
    ins = as_json(npusnap(c, "job", "inspect", str(cks["parent"]), "--json"))
    assert ins["parent"] == f"../{cks['compress'].name}", ins

    order = [n["name"] for n in json.loads(cks["parent"].joinpath("job.json").read_text())["nodes"]]
    job.gate.open()  # restored on the nodes it ran on (the direct path: see test_incremental_job.py)
    b = c.sbatch(_wrap(c, f"npusnap job restore {cks['parent']} --nodes {','.join(order)}"), "--nodes=2")
    state = wait_finished(c, b)
    assert state["job_state"] == "COMPLETED", c.output(b)
    for t in range(2):
        assert job.step_lines(t) == want, f"rank {t} differs from the uninterrupted run"


def test_staged_leave_running_the_downtime_ends_before_the_copy(ranks: RankJob, stage: Path) -> None:
    c = ranks.c
    ck = c.shared / f"ck-staged-lr-{uuid.uuid4().hex[:8]}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", ranks.id, "--stage", str(stage),
                        "--leave-running", "--json"))
    assert len(r["ranks"]) == 4, r
    for x in r["ranks"]:
        names = _names(x)
        assert names.index("dump") < names.index("resume") < names.index("write-behind") < names.index("vote"), x
        copy = x["phases"][names.index("write-behind")]
        assert copy["bytes"] > 0 and copy["seconds"] > 0, x
        # Both measured from the rank's lock: it ran again, unlocked, before its copy began.
        assert 0 < x["downtime"] <= copy["start"] + 1e-6, x
    assert not any(stage.iterdir()), list(stage.iterdir())
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True
    ranks.assert_all_run_on()


@pytest.mark.parametrize("leave_running", [False, True], ids=["stopped", "leave-running"])
def test_the_shared_directory_full_during_the_write_behind_aborts(ranks: RankJob, stage: Path,
                                                                  leave_running: bool) -> None:
    """With --leave-running the ranks run on already when the copy fails: the abort leaves them so."""
    c = ranks.c
    with small_shared_dir(c) as small:
        target = small / "ck"
        extra = ["--leave-running"] if leave_running else []
        r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", ranks.id, "--stage", str(stage), *extra)
        assert r.returncode == STORAGE, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("npusnap: error: prepare: the worker on ") and "write-behind" in last, last
        assert "no space left" in last.lower() and "Traceback" not in r.stderr, r.stderr
        no_checkpoint_left(target)
        assert not any(small.iterdir()), list(small.iterdir())
        assert not any(stage.iterdir()), list(stage.iterdir())
        ranks.assert_all_run_on()


@pytest.mark.parametrize("leave_running", [False, True], ids=["stopped", "leave-running"])
def test_the_coordinator_lost_during_the_write_behind_every_rank_runs_on(ranks: RankJob, stage: Path,
                                                                         leave_running: bool) -> None:
    """SIGKILLed while one node is about to copy: each worker notices at its next word with it
    and ends, its ranks undone (or, having run on at the seal, left running), its copies gone."""
    c = ranks.c
    node = c.nodes[1]
    target = c.shared / f"ck-staged-lost-{uuid.uuid4().hex[:8]}"
    extra = ["--leave-running"] if leave_running else []
    kill_at(coordinator(c, target, ranks.id, {"NPUSNAP_TEST_JOB_PAUSE": f"write-behind@{node}",
                                              "NPUSNAP_TEST_PAUSE_S": "3"}, "--stage", str(stage), *extra),
            f"test pause write-behind@{node}")
    try:
        no_workers_left(c)
        ranks.assert_all_run_on(timeout=90)
        assert not target.exists(), f"{target} exists without a commit"
        assert not any(stage.iterdir()), list(stage.iterdir())
        assert not list(target.parent.glob(f".{target.name}.partial-*/nodes/*")), "a node's copy was left"
    finally:
        for left in target.parent.glob(f".{target.name}.*"):  # the dead coordinator's staging
            shutil.rmtree(left, ignore_errors=True)


def _symlink(stage: Path) -> Path:
    link = stage.parent / "link"
    link.symlink_to(stage)
    return link


def _other_users(stage: Path) -> Path:
    theirs = stage.parent / "theirs"
    theirs.mkdir(0o700)
    os.chown(theirs, other_user().uid, other_user().gid)
    return theirs


def _world_writable(stage: Path) -> Path:
    stage.chmod(0o777)
    return stage


@pytest.mark.parametrize("make,says", [(_symlink, "is a symbolic link"), (_other_users, "not to us or root"),
                                       (_world_writable, "writable by everybody and not sticky")],
                         ids=["symlink", "other-user", "world-writable"])
def test_an_unsafe_stage_directory_is_refused(ranks: RankJob, stage: Path, make, says: str) -> None:  # type: ignore[no-untyped-def]
    c = ranks.c
    hostile = make(stage)
    target = c.shared / f"ck-hostile-{uuid.uuid4().hex[:8]}"
    r = npusnap(c, "job", "checkpoint", "-D", str(target), "--job", ranks.id, "--stage", str(hostile))
    assert r.returncode == PERMISSION, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("npusnap: error: ")]
    assert len(errors) == 1 and f"--stage {hostile}" in errors[0] and says in errors[0], r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    no_checkpoint_left(target)
    assert not any(p.name.startswith("npusnap-job-") for p in stage.iterdir()), list(stage.iterdir())
    ranks.assert_all_run_on()
