"""examples/slurm/npusnap-multinode.sbatch on the test cluster: 4 ranks over 2 nodes, USR1 to the
batch shell (as --signal=B:USR1@N sends it) -> `npusnap job checkpoint` -> requeue -> the
requeued run (SLURM_RESTART_COUNT=1) restores every rank, and its USR1 checkpoint is incremental
against the job checkpoint it restored -> requeue -> the third run restores through that chain;
the ranks' output is bit-identical to an uninterrupted run. A job checkpoint no chain needs is
deleted after a commit. Requeued once more with its latest job checkpoint damaged, the job sets
its whole directory aside (never pruned) and starts afresh."""

from __future__ import annotations

import json
import uuid

from tests.cluster.support import Cluster, poll
from tests.helpers import ROOT, StepGate

from .support import STEP, as_json, npusnap, reference, train_argv, wait_finished

SCRIPT = ROOT / "examples" / "slurm" / "npusnap-multinode.sbatch"
STEPS = 40


def test_usr1_checkpoints_requeues_and_the_next_run_resumes(live_cluster: Cluster) -> None:
    c = live_cluster
    want = reference(c, STEPS)
    ckpt = c.shared / "example-ckpt"
    ckpt.mkdir(exist_ok=True)
    gate = StepGate(ckpt / f"gate-{uuid.uuid4().hex[:8]}", STEPS - 2)  # the ranks still run at the USR1
    c.exports.update({"CKPT_DIR": str(ckpt), **gate.env})  # sbatch passes our environment to the batch script
    try:
        job = c.run("sbatch", "--parsable", f"--output={c.shared}/slurm-%j.out", str(SCRIPT),
                    *train_argv(STEPS, 150)).stdout.strip()
    finally:
        for k in ("CKPT_DIR", *gate.env):
            del c.exports[k]
    root = ckpt / f"job-{job}"
    ranks = [root / f"rank-{t}.out" for t in range(4)]
    # An earlier chain's job checkpoint, and one an earlier prune was cut short deleting.
    stale, cut = root / "run-7", root / ".deleting-run-8"
    for d in (stale, cut):
        (d / "nodes").mkdir(parents=True)
    (stale / "job.json").write_text("{}\n")
    (root / "run-7.json").write_text("{}\n")

    def steps(f):  # type: ignore[no-untyped-def]
        return max((int(m.group(1)) for line in (f.read_text().splitlines() if f.exists() else [])
                    if (m := STEP.match(line))), default=-1)

    def latest() -> str:
        return (root / "latest").readlink().name if (root / "latest").is_symlink() else ""

    assert poll(lambda: all(steps(f) >= 3 for f in ranks), 90), c.output(job)
    c.run("scancel", "--signal=USR1", "--batch", job)
    assert poll(lambda: latest() == "run-0", 60), c.output(job)
    at = max(steps(f) for f in ranks)
    # The requeued run restored the ranks (they step on past the checkpoint): its USR1 now.
    assert poll(lambda: all(steps(f) >= at + 2 for f in ranks), 120), c.output(job)
    c.run("scancel", "--signal=USR1", "--batch", job)
    assert poll(lambda: latest() == "run-1", 60), c.output(job)
    gate.open()
    state = wait_finished(c, job, timeout=180)
    text = c.output(job)
    assert state["job_state"] == "COMPLETED" and state.get("restart_cnt") == 2, (state.get("restart_cnt"), text)
    assert "committed; requeueing" in text and "restoring from run-0" in text, text
    assert "incremental: what changed since run-0" in text and "restoring from run-1 (a chain of 2)" in text, text
    assert json.loads((root / "run-0.json").read_text())["kind"] == "job-checkpoint"
    assert sorted(p.name for p in root.glob("*run-*") if p.is_dir()) == ["run-0", "run-1"]  # the chain
    assert not (root / "run-7.json").exists()
    ins = as_json(npusnap(c, "job", "inspect", str(root / "run-1"), "--json"))
    assert ins["parent"] == "../run-0", ins
    assert all(x["device"].get("method") == "direct" and x["device"].get("referenced", 0) > 0
               for x in ins["ranks"]), ins["ranks"]
    for f in ranks:
        lines = [x for x in f.read_text().splitlines() if STEP.match(x) or x.startswith("done ")]
        assert lines == want, f"{f.name} differs from the uninterrupted run"

    # The latest job checkpoint damaged, the job requeued: its directory is set aside whole.
    image = max((p for p in (root / "run-1").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(image, "r+b") as fh:
        fh.seek(image.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))
    c.run("scontrol", "requeue", job)
    assert poll(lambda: any(ckpt.glob(f"job-{job}.invalid-*")) and all(steps(f) >= 1 for f in ranks), 120), \
        c.output(job)  # the fresh run's ranks step
    text = c.output(job)
    assert "the latest job checkpoint does not verify" in text and "starting afresh" in text, text
    aside = list(ckpt.glob(f"job-{job}.invalid-*"))
    assert len(aside) == 1 and (aside[0] / "run-0").is_dir() and (aside[0] / "run-1").is_dir(), aside
    assert not list(root.glob("run-*")) and not (root / "latest").exists()
    c.run("scancel", job)
    wait_finished(c, job)
