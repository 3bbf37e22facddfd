"""HCCL ranks in a job on the real test cluster (issue #17's first "Done when"): 4 data-parallel
training ranks (tests/hccl/hccl_ranks.c `train`: kernels, an HcclAllReduce of the gradients, the
update) over 2 nodes, one communicator whose ranks talk over the nodes' own addresses (each node's
daemon takes HCCL traffic on it), checkpointed mid-run by `npusnap job checkpoint` while
collectives are in flight, killed, requeued, and restored by the requeued run with the ranks on
swapped nodes: the communicator re-forms at the new addresses through a rendezvous directory on
the job checkpoint, each rank uses its new node's npusim daemon, and every rank's losses and
final weights are bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Optional

from tests.cann.conftest import device_env  # noqa: F401  (the fixtures hccl_ranks needs)
from tests.cluster.support import Cluster, poll
from tests.hccl.conftest import hccl_ranks  # noqa: F401

from .support import as_json, npusnap, wait_finished

# At 20 ms a step the job runs 30 s: however late a loaded machine's checkpoint locks its ranks
# (everything before the lock runs on: the CLI, srun, the workers), the restored ranks still run
# for seconds, long enough for the daemons' client lists to show them. At 300 steps they were
# locked at step ~290 under load and exited half a second after their restore, unseen.
STEPS = 1500
TRAIN_ENV = {"HCCL_TRAIN_STEPS": str(STEPS), "HCCL_EXEC_TIMEOUT": "60", "HCCL_CONNECT_TIMEOUT": "30"}


class HcclJob:
    """A batch job of 2 nodes x 2 hccl_ranks `train` ranks under `npusnap run` (rank = SLURM_PROCID,
    device = SLURM_LOCALID, rank 0 writes the root info on the shared storage). Its requeued run
    (SLURM_RESTART_COUNT > 0) restores the job checkpoint named in its `restore` file instead.
    finish_fast() lets its ranks run the steps left without their pause."""

    def __init__(self, c: Cluster, exe: Path, ld_path: str, sleep_us: int, steps: int = STEPS,
                 extra: Optional[dict[str, str]] = None) -> None:
        self.c = c
        self.out = c.shared / f"hccl-{uuid.uuid4().hex[:8]}"
        self.out.mkdir()
        self.fast = self.out / "fast"
        env = {**TRAIN_ENV, "HCCL_TRAIN_STEPS": str(steps), "HCCL_TRAIN_SLEEP_US": str(sleep_us),
               "HCCL_TRAIN_FAST": str(self.fast), "LD_LIBRARY_PATH": ld_path, **(extra or {})}
        rank = "exec \"$0\" train \"$SLURM_PROCID\" \"$SLURM_NTASKS\" \"$SLURM_LOCALID\" \"$1\""
        script = self.out / "ranks.sh"
        script.write_text(
            "#!/bin/bash\n"
            + "".join(f"export {k}={v}\n" for k, v in env.items())
            + f"if [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ]; then exec $(cat {self.out}/restore); fi\n"
            + f"srun --output={self.out}/rank-%t.out --input=none npusnap run -- sh -c '{rank}' "
            + f"{exe} {self.out}/root.info\n")
        script.chmod(0o755)
        self.id = c.sbatch(script, "--nodes=2", "--ntasks-per-node=2", "--open-mode=append")

    def finish_fast(self) -> None:
        """The test is done with the running ranks: the steps left run without their pause."""
        self.fast.touch()

    def lines(self, t: int) -> list[str]:
        f = self.out / f"rank-{t}.out"
        return f.read_text(errors="replace").splitlines() if f.exists() else []

    def last_step(self, t: int) -> int:
        return max((int(x.split()[1]) for x in self.lines(t) if x.startswith("step ")), default=-1)

    def results(self, t: int) -> list[str]:
        """What must be bit-identical: every step's loss and the final weights' hash."""
        return [x for x in self.lines(t) if x.startswith(("step ", "final "))]


def test_hccl_ranks_checkpointed_requeued_and_restored_on_swapped_nodes_bit_identical(
        live_cluster: Cluster, hccl_ranks: Path, device_env: dict[str, str]) -> None:  # noqa: F811
    c = live_cluster
    ld = device_env["LD_LIBRARY_PATH"]
    ref = HcclJob(c, hccl_ranks, ld, sleep_us=0)
    state = wait_finished(c, ref.id, timeout=180)
    assert state["job_state"] == "COMPLETED", c.output(ref.id)
    want = [ref.results(t) for t in range(4)]
    assert all(w == want[0] and len(w) == STEPS + 1 for w in want), (want[0][-2:], c.output(ref.id))

    # A short pause per step: the job's lock lands in a rank's kernels, its AllReduce or the pause.
    job = HcclJob(c, hccl_ranks, ld, sleep_us=20000)
    assert poll(lambda: all(job.last_step(t) >= 5 for t in range(4)), 90), \
        ([job.last_step(t) for t in range(4)], c.output(job.id))
    ck = c.shared / f"ck-{job.id}"
    r = as_json(npusnap(c, "job", "checkpoint", "-D", str(ck), "--job", job.id, "--json"))
    assert [x["rank"] for x in r["ranks"]] == [0, 1, 2, 3], r
    inspect = as_json(npusnap(c, "job", "inspect", str(ck), "--json"))
    assert all(x["device"]["resources"].get("hccl communicators") == 1 for x in inspect["ranks"]), inspect
    wait_finished(c, job.id)  # its ranks were killed: the job ends
    stopped_at = [job.last_step(t) for t in range(4)]
    assert all(s < STEPS - 200 for s in stopped_at), stopped_at  # 4 s or more left to run after the restore

    # Requeued: the next run restores the checkpoint with node 0's ranks (0 and 1, the new root)
    # on the other node and node 1's on the first.
    manifest = json.loads((ck / "job.json").read_text())
    old = {x["pid"]: x["node"] for x in manifest["ranks"]}
    first = manifest["nodes"][0]["name"]
    other = next(n for n in c.nodes if n != first)
    (job.out / "restore").write_text(f"npusnap job restore {ck} --nodes {other},{first}\n")
    c.run("scontrol", "requeue", job.id)

    # Every restored rank is a client of its new node's daemon, not of the one its NPUSIM_SOCKET names.
    def on_new_daemons() -> bool:
        clients = {n: _clients(c, n) for n in c.nodes}
        return all(pid in clients[other if node == first else first] and pid not in clients[node]
                   for pid, node in old.items())

    assert poll(on_new_daemons, 120), \
        f"daemons' clients {({n: sorted(_clients(c, n)) for n in c.nodes})}, ranks were {old}:\n{c.output(job.id)[-4000:]}"
    job.finish_fast()
    state = wait_finished(c, job.id, timeout=180)
    text = c.output(job.id)
    assert state["job_state"] == "COMPLETED" and state.get("restart_cnt") == 1, text
    assert f"{first} -> {other}" in text and "the ranks exited 0" in text, text
    for t in range(4):
        assert job.results(t) == want[t], f"rank {t} (stopped at step {stopped_at[t]}) differs from the uninterrupted run"
        assert job.lines(t)[-1] == "done", job.lines(t)[-3:]
    assert list((ck / "rendezvous").iterdir()) == [], "the restore's rendezvous directory was left behind"
    assert as_json(npusnap(c, "job", "verify", str(ck), "--json"))["valid"] is True  # restorable again


def _clients(c: Cluster, node: str) -> set[int]:
    r = npusnap(c, "device", "status", "--socket", c.npusim_socket(node), "--json", timeout=30)
    if r.returncode != 0:
        return set()
    return {int(x["pid"]) for x in json.loads(r.stdout).get("clients", [])}
