"""tests/unit needs no privileges and no CRIU: run it as nobody, with CRIU off PATH.

The venv's interpreter lives under /root, which nobody cannot execute; the system's python3 of
the same minor version runs the suite instead, with the venv's packages and this checkout on
PYTHONPATH (tests/unit loads no native module). Where nobody cannot read the checkout or the
venv (a clone under a private directory), the suite runs from a copy in a directory of ours."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _readable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _same_minor(python: Path) -> bool:
    r = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and r.stdout.strip() == str(sys.version_info[:2])


# What the copy leaves out: native parts and packages tests/unit never imports.
NOT_NEEDED = shutil.ignore_patterns("_native", "*__mypyc*", "__pycache__", ".venv", "numpy*", "mypy*", "pip",
                                    "cryptography*", "setuptools*", "scikit_build*", "pybind11*", "ruff*")


@pytest.fixture
def readable_tree() -> Iterator[tuple[Path, Path]]:
    """(checkout, site-packages) that nobody can read: these, or copies in a directory of ours."""
    site = Path(sysconfig.get_paths()["purelib"])
    if _readable_by_others(ROOT) and _readable_by_others(site):
        yield ROOT, site
        return
    top = Path(tempfile.mkdtemp(prefix="npusnap-unit-", dir="/tmp"))
    try:
        top.chmod(0o755)
        shutil.copytree(ROOT / "npusnap_cli", top / "repo" / "npusnap_cli", ignore=NOT_NEEDED)
        shutil.copytree(ROOT / "tests", top / "repo" / "tests", ignore=NOT_NEEDED)
        shutil.copy2(ROOT / "pyproject.toml", top / "repo" / "pyproject.toml")
        shutil.copytree(site, top / "site", ignore=NOT_NEEDED)
        for d, dirs, files in os.walk(top):
            for name in dirs:
                os.chmod(os.path.join(d, name), 0o755)
            for name in files:
                os.chmod(os.path.join(d, name), 0o644)
        yield top / "repo", top / "site"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_the_unit_suite_runs_as_nobody_without_criu(readable_tree: tuple[Path, Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become nobody")
    if not SYSTEM_PYTHON.exists() or not _same_minor(SYSTEM_PYTHON):
        pytest.skip(f"needs {SYSTEM_PYTHON} of Python {sys.version_info[0]}.{sys.version_info[1]} for nobody to run")
    root, site = readable_tree
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": f"{root}{os.pathsep}{site}"}
    r = subprocess.run(["runuser", "-u", "nobody", "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                        str(SYSTEM_PYTHON), "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"],
                       cwd=root, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]
