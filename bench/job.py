"""python -m bench.job [--scratch-mb N] [--repeat N]: the job section of the benchmark.

The time of `npusnap job checkpoint` (start to commit) for 1, 2 and 4 ranks of the same state
each (1 node x 1, 2 nodes x 1, 2 nodes x 2), on the test cluster (scripts/test-cluster.sh,
brought up privately and always brought down). Nodes run their stages in parallel, so the time
should follow the largest node's state, not the job's sum: the ratios to 1 rank are printed next
to the ranks' state ratio. Rows of 2 x 2 ranks --leave-running with and without --stage
(node-local dump, write-behind), with the direct data path, and --live: the ranks' longest
downtime and the time to commit, and --live's downtime against the full checkpoint. Skipped, with the reason,
where Slurm or root is missing."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from .util import BENCH_DIR, median

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((1, 1), (2, 1), (2, 2))  # (nodes, ranks per node)


def _ranks_script(out: Path, steps: int, scratch_mb: int) -> Path:
    train = ["python", str(ROOT / "examples" / "train.py"), "--steps", str(steps), "--sleep-ms", "50",
             "--dim", "64", "--samples", "128", "--scratch-mb", str(scratch_mb)]
    script = out / "ranks.sh"
    script.write_text("#!/bin/bash\nsrun --output=%s/rank-%%t.out --input=none npusnap run -- %s\n"
                      % (out, " ".join(train)))
    script.chmod(0o755)
    return script


def _started(out: Path, ranks: int, timeout: float = 120) -> bool:
    """Every rank has printed a training step (its device state is allocated)."""
    from tests.cluster.support import poll

    def ready() -> bool:
        files = [out / f"rank-{t}.out" for t in range(ranks)]
        return all(f.exists() and "\nstep " in "\n" + f.read_text() for f in files)

    return poll(ready, timeout)


def measure_shape(c: Any, nodes: int, per_node: int, scratch_mb: int, repeat: int) -> dict[str, Any]:
    """`repeat` checkpoints (--leave-running) of one job of nodes x per_node ranks."""
    out = c.shared / f"bench-{uuid.uuid4().hex[:8]}"
    out.mkdir()
    job = c.sbatch(_ranks_script(out, 100000, scratch_mb), f"--nodes={nodes}", f"--ntasks-per-node={per_node}")
    samples: list[dict[str, Any]] = []
    try:
        if not _started(out, nodes * per_node):
            raise RuntimeError(f"the ranks of job {job} did not start: {c.output(job)[-800:]}")
        for i in range(repeat):
            samples.append(_checkpoint(c, job, out / f"ck{i}", []))
    finally:
        c.run("scancel", job, check=False)
        shutil.rmtree(out, ignore_errors=True)
    return {"nodes": nodes, "ranks_per_node": per_node, "ranks": nodes * per_node, "scratch_mb": scratch_mb,
            "to_commit_s": median([s["to_commit_s"] for s in samples]), "samples": samples}


def _checkpoint(c: Any, job: str, target: Path, extra: list[str]) -> dict[str, Any]:
    """One `npusnap job checkpoint --leave-running` of job into target (removed after): its time to
    commit, the slowest rank's time in each of its own stages, the longest rank downtime."""
    t0 = time.monotonic()
    r = subprocess.run(["npusnap", "job", "checkpoint", "-D", str(target), "--job", job, "--leave-running",
                        "--json", *extra], env=c.env, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL, cwd=c.shared)
    wall = time.monotonic() - t0
    shutil.rmtree(target, ignore_errors=True)
    if r.returncode != 0:
        raise RuntimeError(f"npusnap job checkpoint exited {r.returncode}: {r.stderr.strip()[-800:]}")
    doc = json.loads(r.stdout)
    stages = {s["name"]: s["seconds"] for s in doc["stages"]}
    to_commit = sum(stages[s] for s in ("connect", "prepare", "commit"))
    rank_stages: dict[str, float] = {}
    for x in doc["ranks"]:  # the slowest rank's time in each of its own stages
        for p in x["phases"]:
            rank_stages[p["name"]] = max(rank_stages.get(p["name"], 0.0), p["seconds"])
    downtime = max((x["downtime"] for x in doc["ranks"] if x.get("downtime") is not None), default=None)
    return {"to_commit_s": to_commit, "wall_s": wall, "stages": stages, "slowest_rank": rank_stages,
            "downtime_s": downtime}


def measure_staged(c: Any, scratch_mb: int, repeat: int) -> dict[str, Any]:
    """2 nodes x 2 ranks checkpointed --leave-running with and without --stage (a node-local
    directory under /tmp), with the direct data path, and --live with it, in turn on the one job
    each round, so that all see the same machine."""
    import tempfile

    out = c.shared / f"bench-{uuid.uuid4().hex[:8]}"
    out.mkdir()
    local = Path(tempfile.mkdtemp(prefix="npusnap-bench-stage-"))
    job = c.sbatch(_ranks_script(out, 100000, scratch_mb), "--nodes=2", "--ntasks-per-node=2")
    variants = {"shared": [], "staged": ["--stage", str(local)], "direct": ["--data-path", "direct"],
                "live": ["--live", "--data-path", "direct"]}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    try:
        if not _started(out, 4):
            raise RuntimeError(f"the ranks of job {job} did not start: {c.output(job)[-800:]}")
        for i in range(repeat):
            for name, extra in variants.items():
                runs[name].append(_checkpoint(c, job, out / f"{name}{i}", extra))
    finally:
        c.run("scancel", job, check=False)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    return {name: {"to_commit_s": median([s["to_commit_s"] for s in samples]),
                   "downtime_s": median([s["downtime_s"] or 0.0 for s in samples]), "samples": samples}
            for name, samples in runs.items()}


def measure(scratch_mb: int, repeat: int, progress: Any = print) -> dict[str, Any]:
    """The job section, or {"skipped": why}."""
    from tests.cluster.support import Cluster, free_net, missing

    why = missing()
    if why:
        return {"skipped": why}
    name = f"b{os.getpid() % 10**7}"
    c = Cluster(name=name, dir=Path("/run/npusnap-cluster") / name, net=free_net())
    try:
        progress(f"test cluster {name} up")
        c.up()
        shapes = []
        for nodes, per_node in SHAPES:
            progress(f"{nodes} node(s) x {per_node} rank(s) of {scratch_mb} MiB device scratch, {repeat} sample(s)")
            shapes.append(measure_shape(c, nodes, per_node, scratch_mb, repeat))
        progress(f"2 nodes x 2 ranks with and without --stage, direct, --live, {repeat} sample(s) each")
        staged = measure_staged(c, scratch_mb, repeat)
    finally:
        r = c.down()
        if r.returncode == 0:
            shutil.rmtree(c.dir, ignore_errors=True)
    one = shapes[0]["to_commit_s"]
    for s in shapes:
        s["ratio_to_1_rank"] = round(s["to_commit_s"] / one, 3) if one else None
        s["largest_node_state_ratio"] = s["ranks_per_node"]  # every rank holds the same state
        s["sum_state_ratio"] = s["ranks"]
    return {"shapes": shapes, "staged": staged}


def render(doc: dict[str, Any]) -> str:
    if "skipped" in doc:
        return f"job: skipped: {doc['skipped']}"
    lines = ["job checkpoint, start to commit (median); stages run in parallel across nodes:",
             f"{'ranks':>5} {'nodes':>5} {'seconds':>8} {'x 1 rank':>9} {'largest node':>13} {'sum':>4}"]
    for s in doc["shapes"]:
        lines.append(f"{s['ranks']:>5} {s['nodes']:>5} {s['to_commit_s']:>8.2f} {s['ratio_to_1_rank']:>9.2f} "
                     f"{s['largest_node_state_ratio']:>12}x {s['sum_state_ratio']:>3}x")
    if "staged" in doc:
        lines.append("4 ranks --leave-running, the longest rank downtime and start to commit (median):")
        for name, what in (("shared", "dumped to the shared directory"), ("staged", "--stage, write-behind"),
                           ("direct", "--data-path direct"), ("live", "--live --data-path direct")):
            if name in doc["staged"]:
                st = doc["staged"][name]
                lines.append(f"  {what:<32} downtime {st['downtime_s']:>6.2f}s  to commit {st['to_commit_s']:>6.2f}s")
        if {"direct", "live"} <= set(doc["staged"]):  # #19's goal: at most 0.25x the full checkpoint
            live, full = doc["staged"]["live"]["downtime_s"], doc["staged"]["direct"]["to_commit_s"]
            lines.append(f"  --live downtime / full --leave-running checkpoint: {live / full:.2f}x (goal <= 0.25x)")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.job", description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--scratch-mb", type=int, default=64, help="device scratch memory of each rank")
    ap.add_argument("--repeat", type=int, default=3, help="checkpoints per shape (median reported)")
    ap.add_argument("--output", type=Path, default=BENCH_DIR / "job.json")
    args = ap.parse_args(argv)
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        doc = measure(args.scratch_mb, max(1, args.repeat), progress)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"bench.job: {e}", file=sys.stderr)
        return 1
    print(render(doc))
    if "skipped" not in doc:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(doc, indent=2) + "\n")
        progress(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
