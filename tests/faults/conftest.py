"""The fault matrix: every case ends either in a valid, verified checkpoint with the
workload in the requested state, or in one error line, a documented exit code, the
workload running and unlocked with its device data intact, and no valid-looking
checkpoint. A test that passes is a case that ended safe; the summary counts them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import NpuSimDaemon, npusim_daemon  # noqa: F401  (fixture re-export)
from tests.integration.netlock_support import iptables, peer  # noqa: F401  (fixture re-export)

from .support import TRAIN, Reference

_outcomes: dict[str, str] = {}
NOTES: list[str] = []  # things that ended safe but are worth a look (e.g. leftovers)

_HERE = str(Path(__file__).resolve().parent)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/faults/" not in report.nodeid and not str(report.fspath).startswith(_HERE):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            _outcomes[report.nodeid] = "xpassed" if report.outcome == "passed" else "xfailed"
        else:
            _outcomes[report.nodeid] = report.outcome
    elif report.when == "teardown" and report.outcome == "failed":
        _outcomes[report.nodeid] = "failed"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    tried = {k: v for k, v in _outcomes.items() if v != "skipped"}
    if not tried and not _outcomes:
        return
    safe = [k for k, v in tried.items() if v == "passed"]
    tr = terminalreporter
    tr.section("fault matrix")
    for k, v in sorted(tried.items()):
        if v != "passed":
            tr.write_line(f"  not safe ({v}): {k}")
    for n in NOTES:
        tr.write_line(f"  note: {n}")
    skipped = len(_outcomes) - len(tried)
    tr.write_line(f"fault matrix: {len(tried)} cases tried, {len(safe)} ended safe"
                  + (f" ({skipped} skipped)" if skipped else ""))


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    """examples/train.py's per-step lines from an uninterrupted run (its own daemon)."""
    d = tempfile.mkdtemp(prefix="npf-")
    daemon = NpuSimDaemon(socket=os.path.join(d, "ref.sock"))
    daemon.start()
    try:
        env = {**os.environ, "NPUSIM_SOCKET": daemon.socket}
        r = subprocess.run([sys.executable, str(TRAIN), "--steps", "400", "--sleep-ms", "0",
                            "--scratch-mb", "1"], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        yield Reference([x for x in r.stdout.splitlines() if x.startswith("step ")])
    finally:
        daemon.stop()
        for f in Path(d).iterdir():
            f.unlink()
        os.rmdir(d)
