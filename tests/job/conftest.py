"""Fixtures of tests/job."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.cluster.fixtures import ensure_up
from tests.cluster.support import Cluster

from .support import RankJob


@pytest.fixture(scope="module")
def ranks(cluster: Cluster) -> Iterator[RankJob]:
    """One long job of 4 ranks (2 per node) that a module's tests checkpoint and leave running
    (or abort): one per module, cancelled at its end."""
    ensure_up(cluster)
    job = RankJob(cluster, steps=100000, sleep_ms=50)
    try:
        job.wait_steps(2)
        yield job
    finally:
        cluster.cancel_all()
