"""Incremental and compressed job checkpoints on the real test cluster: a 2-node job of 2 npusim
training ranks checkpointed with the direct data path into the chunk store (--compress), then
again with --parent (each rank's images reference its images in the first), killed and restored
from the second, each node's ranks on the other node, bit-identical to an uninterrupted run; a
flipped byte in the parent's rank image is caught by `job verify` of the child; a parent of
another shape is refused."""

from __future__ import annotations

import json

import yaml

from tests.cluster.support import Cluster
from tests.helpers import damage_chunk

from .support import RankJob, as_json, npusnap, reference, wait_finished
from .test_job import _wrap

STEPS = 40  # held before the last step until both checkpoints are taken (a step gate)


def test_job_chain_with_compressed_links_restores_bit_identical(live_cluster: Cluster) -> None:
    c = live_cluster
    want = reference(c, STEPS)
    job = RankJob(c, STEPS, sleep_ms=150, per_node=1, gate_at=STEPS - 2)
    job.wait_steps(3)
    ck1, ck2 = c.shared / f"inc1-{job.id}", c.shared / f"inc2-{job.id}"
    r1 = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck1), "--job", job.id, "--leave-running",
                         "--data-path", "direct", "--compress", "zstd", "--json"))
    assert len(r1["ranks"]) == 2, r1
    job.wait_steps(min(max(job.last_step(t) for t in range(2)) + 2, job.gate.at))
    r2 = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck2), "--job", job.id, "--parent", str(ck1),
                         "--compress", "zstd", "--json"))
    assert len(r2["ranks"]) == 2, r2
    wait_finished(c, job.id)  # its ranks were killed: the job ends

    ins = as_json(npusnap(c, "job", "inspect", str(ck2), "--json"))
    assert ins["parent"] == f"../{ck1.name}", ins
    assert all(x["device"].get("method") == "direct" for x in ins["ranks"]), ins
    assert all(v is not None for v in ins["node_stored_bytes"].values()), ins
    node = ins["nodes"][0]
    m = yaml.safe_load((ck2 / node["dir"] / "manifest.yaml").read_text())
    assert m["parent"]["path"].endswith(f"{ck1.name}/{node['dir']}"), m["parent"]
    assert m["device"]["referenced"] > 0, m["device"]
    v = as_json(npusnap(c, "job", "verify", str(ck2), "--json"))
    assert all(len(links) == 1 for links in v["chains"].values()), v

    # Restored from the second with the nodes swapped: each node's direct images (and the chain's)
    # go into the other node's daemon, whichever daemon the ranks' environment named.
    order = [n["name"] for n in json.loads(ck2.joinpath("job.json").read_text())["nodes"]]
    job.gate.open()
    b = c.sbatch(_wrap(c, f"npusnap job restore {ck2} --nodes {','.join(reversed(order))}"), "--nodes=2")
    state = wait_finished(c, b)
    assert state["job_state"] == "COMPLETED", c.output(b)
    assert f"{order[0]} -> {order[1]}" in c.output(b), c.output(b)
    for t in range(2):
        assert job.step_lines(t) == want, f"rank {t} differs from the uninterrupted run"

    # A flipped byte in a chunk of the parent's rank device image: the child's verify names it.
    pm = yaml.safe_load((ck1 / node["dir"] / "manifest.yaml").read_text())
    entry = next(f for f in pm["files"] if f["path"].startswith("device/") and f.get("chunks"))
    digest, codec = entry["chunks"][1].split()[:2]
    damage_chunk(ck1 / "nodes" / ".npusnap-store", digest, codec)
    bad = npusnap(c, "job", "verify", str(ck2))
    assert bad.returncode == 8 and ck1.name in bad.stderr and "dev0.img" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr

    # A parent of another shape: a new job of 1 rank against the 2 ranks of ck1.
    one = RankJob(c, 150, sleep_ms=150, per_node=1, nodes=1)  # runs on past the refused checkpoint
    one.wait_steps(1)
    r = npusnap(c, "job", "checkpoint", "-D", str(c.shared / f"inc3-{one.id}"), "--job", one.id,
                "--parent", str(ck2))
    assert r.returncode == 8, r.stderr
    assert "cannot be" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (c.shared / f"inc3-{one.id}").exists()
    one.assert_all_run_on()
