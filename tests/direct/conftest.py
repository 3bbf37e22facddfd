"""Fixtures for the direct-path tests: npusim clients that are always reaped."""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import pytest

from .support import Client


@pytest.fixture
def client(npusim_daemon) -> Iterator[Callable[..., Client]]:  # type: ignore[no-untyped-def]
    made: list[Client] = []

    def make(extra_env: Optional[dict[str, str]] = None) -> Client:
        c = Client(npusim_daemon.env, extra_env)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
