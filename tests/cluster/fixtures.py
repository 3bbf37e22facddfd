"""The test cluster (scripts/test-cluster.sh): brought up once per session, private to it, and
always brought down (and its state directory removed) at the end, also when a test failed.
A plugin of the root conftest (pytest_plugins), so tests/cluster and tests/job share the one
session cluster."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import pid_alive

from .support import Cluster, free_net, missing

STATE_ROOT = Path("/run/npusnap-cluster")


def down_stale_sessions() -> None:
    """Bring down the clusters of test sessions that died without doing it (SIGKILL): named
    t<pid> after a pid that no longer runs."""
    for d in STATE_ROOT.glob("t*"):
        if not re.fullmatch(r"t\d+", d.name) or pid_alive(int(d.name[1:])):
            continue
        stale = Cluster(name=d.name, dir=d, net="10.213.0")  # down does not use the address
        if stale.down().returncode == 0:
            shutil.rmtree(d, ignore_errors=True)


DOWN_TEST = "tests/cluster/test_cluster.py::test_down_leaves_nothing"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test that brings the cluster down runs last of the session: the tests of tests/job after
    tests/cluster find it up, instead of bringing it up a second time."""
    down = [item for item in items if item.nodeid == DOWN_TEST]
    items[:] = [item for item in items if item.nodeid != DOWN_TEST] + down


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    why = missing()
    if why:
        pytest.skip(why)
    down_stale_sessions()
    name = f"t{os.getpid()}"
    c = Cluster(name=name, dir=STATE_ROOT / name, net=free_net())
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


def ensure_up(cluster: Cluster) -> None:
    if cluster.script("status").returncode != 0:
        try:
            cluster.up()
        except RuntimeError as e:
            pytest.fail(str(e), pytrace=False)


@pytest.fixture
def live_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """idle_cluster, brought up again first if a test brought it down (test_down_leaves_nothing)."""
    ensure_up(cluster)
    try:
        yield cluster
    finally:
        cluster.cancel_all()
