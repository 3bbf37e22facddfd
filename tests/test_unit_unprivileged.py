"""tests/unit needs no privileges and no CRIU: run it as nobody, with CRIU off PATH.

The venv's interpreter lives under /root, which nobody cannot execute; the system's python3 of
the same minor version runs the suite instead, with the venv's packages and this checkout on
PYTHONPATH (tests/unit loads no native module)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _readable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _same_minor(python: Path) -> bool:
    r = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and r.stdout.strip() == str(sys.version_info[:2])


def test_the_unit_suite_runs_as_nobody_without_criu() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become nobody")
    site = Path(sysconfig.get_paths()["purelib"])
    if not SYSTEM_PYTHON.exists() or not _same_minor(SYSTEM_PYTHON):
        pytest.skip(f"needs {SYSTEM_PYTHON} of Python {sys.version_info[0]}.{sys.version_info[1]} for nobody to run")
    if not (_readable_by_others(ROOT) and _readable_by_others(site)):
        pytest.skip(f"{ROOT} or {site} is not readable by other users")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    r = subprocess.run(["runuser", "-u", "nobody", "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                        str(SYSTEM_PYTHON), "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]
