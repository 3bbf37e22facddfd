"""Fixtures for the cuda backend's tests: the test shim must be installed."""

from __future__ import annotations

import pytest

from .support import SHIM


@pytest.fixture(autouse=True)
def _shim_installed() -> None:
    if not SHIM.exists():
        pytest.fail(f"{SHIM} is missing: build and install with `pip install --no-build-isolation .`")
