"""The pieces of the job fault cases that need no cluster: one job checkpoint per job and node at
a time (the worker's lock), a worker's failure kept as the kind it was, and bench.job's skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npusnap_cli.core.job import coordinator, worker
from npusnap_cli.errors import JobAborted, JobBusy, StorageProblem


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "jobs"
    monkeypatch.setattr(worker, "REGISTRY", d)
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")
    return d


def test_a_second_lock_of_the_same_job_and_node_is_refused_until_the_first_goes(registry: Path) -> None:
    fd = worker._checkpoint_lock("7", "node1")
    try:
        with pytest.raises(JobBusy, match="another `npusnap job checkpoint` of job 7 is running on node1") as e:
            worker._checkpoint_lock("7", "node1")
        assert e.value.exit_code == 11
        os.close(worker._checkpoint_lock("7", "node2"))  # another node, another job: free
        os.close(worker._checkpoint_lock("8", "node1"))
    finally:
        os.close(fd)
    os.close(worker._checkpoint_lock("7", "node1"))  # the kernel let go with the descriptor
    assert (registry / "c1.7.node1.checkpoint.lock").stat().st_mode & 0o777 == 0o600


def test_the_lock_is_not_a_link_somebody_planted(registry: Path, tmp_path: Path) -> None:
    registry.mkdir()
    (registry / "c1.7.node1.checkpoint.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StorageProblem, match="cannot open the job's lock"):
        worker._checkpoint_lock("7", "node1")
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("kind,cls,code", [("StorageProblem", StorageProblem, 12), ("JobBusy", JobBusy, 11),
                                           ("CriuFailed", JobAborted, 15), (None, JobAborted, 15)])
def test_a_workers_failure_keeps_its_kind_only_where_it_tells_the_operator_more(kind: object, cls: type,
                                                                               code: int) -> None:
    e = coordinator._worker_failure("prepare", "node2", {"error": "boom", "error_kind": kind})
    assert type(e) is cls and e.exit_code == code
    assert e.message == "prepare: the worker on node2 failed: boom"

