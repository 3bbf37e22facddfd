"""The project's own style gates: ruff on the Python tree, mypy (strict) on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise",
                        "npusnap_cli", "tests", "bench", "examples", "scripts"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
