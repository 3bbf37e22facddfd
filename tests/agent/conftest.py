"""Fixtures for the agent and injector tests: the built agent and injector (the
installed ones, else compiled from native/agent now), small C targets, real
target processes (always reaped), and a CRIU probed with `criu check`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

from npusnap_cli import native

from .support import Target, criu_binary

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
AGENT_SRC = REPO / "native" / "agent"
CC = os.environ.get("CC", "cc")


def _installed(name: str) -> Optional[Path]:
    """The artifact of the installed package (pip install .), if there is one."""
    p = native.AGENT_LIB if name == "agent" else native.INJECTOR
    return p if p.exists() else None


def _compile(out: Path, *args: str) -> Path:
    subprocess.run([CC, "-O2", "-Wall", "-o", str(out), *args], check=True)
    return out


@pytest.fixture(scope="session")
def native_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native")


@pytest.fixture(scope="session")
def agent_lib(native_build: Path) -> Path:
    """The agent library: $NPUSNAP_AGENT_LIB, the installed one, or built from source now."""
    env = os.environ.get("NPUSNAP_AGENT_LIB")
    if env:
        return Path(env)
    found = _installed("agent")
    if found:
        return found
    return _compile(
        native_build / "libnpusnap_agent.so",
        "-shared", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wl,-z,nodelete",
        str(AGENT_SRC / "agent.c"), "-ldl",
    )  # fmt: skip


@pytest.fixture(scope="session")
def injector(native_build: Path) -> Path:
    env = os.environ.get("NPUSNAP_INJECTOR")
    if env:
        return Path(env)
    found = _installed("inject")
    if found:
        return found
    return _compile(native_build / "npusnap-inject", str(AGENT_SRC / "inject.c"), "-ldl")


@pytest.fixture(scope="session")
def c_programs(native_build: Path) -> dict[str, Path]:
    """Small C targets (tests/agent/targets.c) and a fake runtime library."""
    out = {}
    for mode in ("sleeper", "reader"):
        out[mode] = _compile(
            native_build / mode, f"-DMODE_{mode.upper()}", str(HERE / "targets.c")
        )
    out["fake_runtime"] = _compile(
        native_build / "libfake_acl.so", "-shared", "-fPIC", str(HERE / "fake_runtime.c")
    )
    return out


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    """spawn(argv, env=...) -> Target, killed and reaped at the end of the test."""
    targets: list[Target] = []
    counter = [0]

    def _spawn(argv: list[str], env: Optional[dict[str, str]] = None, **kw) -> Target:  # type: ignore[no-untyped-def]
        counter[0] += 1
        t = Target(argv, tmp_path / f"target{counter[0]}.out", env, **kw)
        targets.append(t)
        return t

    try:
        yield _spawn
    finally:
        for t in targets:
            t.stop()


@pytest.fixture(scope="session")
def criu() -> str:
    """A CRIU that `criu check` accepts, else skip (probed for real, not just found)."""
    path = criu_binary()
    if not path:
        pytest.skip("CRIU not found")
    if os.geteuid() != 0:
        pytest.skip("CRIU needs root here")
    r = subprocess.run([path, "check"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"`criu check` failed: {(r.stderr or r.stdout).strip()[-200:]}")
    return path


