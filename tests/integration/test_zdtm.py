"""A handful of CRIU's zdtm static tests, bare and through npusnap (`make zdtm` runs them all)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, npusnap_cmd, requires_criu

pytestmark = requires_criu


def test_quick_zdtm_tests_pass_through_npusnap_where_they_pass_bare(tmp_path: Path) -> None:
    cache = os.environ.get("CRIU_CACHE", "/var/cache/npusnap")
    if not glob.glob(f"{cache}/criu-*/test/zdtm/static") and not glob.glob(f"{cache}/criu_*.orig.tar.xz"):
        pytest.skip(f"no CRIU source in {cache} (scripts/install-criu.sh puts it there)")
    report = tmp_path / "zdtm.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "zdtm.py"), "--quick", "--json", str(report),
                        *(["--npusnap", npusnap_cmd()[0]] if len(npusnap_cmd()) == 1 else [])], capture_output=True, text=True, timeout=280,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(report.read_text())
    assert len(rows) >= 6
    for row in rows:
        assert row["bare"]["ok"], row  # they pass bare here; a bare failure is an environment problem
        assert row["npusnap"]["ok"], row
