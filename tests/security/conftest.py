"""Fixtures for the attack tests: a root npusim daemon that serves the device group, on a socket
that the group's members (and the attacker) can reach."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

from tests.conftest import NpuSimDaemon
from tests.users import DEVICE_GROUP, device_user


@pytest.fixture
def group_daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[NpuSimDaemon]:
    """npusimd --group npusim-users, run by root, its socket in a fresh root-owned 0755 directory."""
    device_user()  # creates the group and its member on first use
    directory = tempfile.mkdtemp(prefix="npusim-sec-")
    os.chmod(directory, 0o755)
    try:
        with NpuSimDaemon(socket=os.path.join(directory, "daemon.sock"), group=DEVICE_GROUP).running(monkeypatch) as d:
            yield d
    finally:
        shutil.rmtree(directory, ignore_errors=True)
