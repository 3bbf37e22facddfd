"""The test cluster (scripts/test-cluster.sh): brought up once per session, private to it, and
always brought down (and its state directory removed) at the end, also when a test failed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from .support import Cluster, free_net, missing


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    why = missing()
    if why:
        pytest.skip(why)
    name = f"t{os.getpid()}"[:8]
    c = Cluster(name=name, dir=Path("/run/npusnap-cluster") / name, net=free_net())
    try:
        try:
            c.up()
        except RuntimeError as e:
            pytest.fail(str(e), pytrace=False)
        yield c
    finally:
        r = c.down()
        if r.returncode == 0:
            shutil.rmtree(c.dir, ignore_errors=True)
        else:  # keep the logs for whoever looks at it
            print(f"test-cluster.sh down exited {r.returncode}: {r.stderr.strip()} (logs in {c.dir}/logs)")


@pytest.fixture
def idle_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """The session's cluster, with no job left running by this test."""
    try:
        yield cluster
    finally:
        cluster.cancel_all()
