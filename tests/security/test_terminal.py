"""Text from a workload (argv, comm, paths) never reaches the operator's terminal raw: the
owner of a checkpointed job puts ESC sequences in its argv and process name, and `list`,
`inspect` and error lines show them escaped. The job runs as root: CRIU here cannot dump
another user's process (prlimit on it is refused in this sandbox), and the bytes are the attack."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import criu_works, kill_and_wait, npusnap

pytestmark = pytest.mark.criu

PAINT = "\x1b[2J\x1b[H\x1b]0;owned\x07\rFAKE OK\x1b[31m"
# Clears the screen, retitles the window, and renames its own comm, then loops.
JOB = ("import ctypes, sys, time\n"
       "ctypes.CDLL(None).prctl(15, b'\\x1b[2Jevil', 0, 0, 0)\n"
       "print('ready', flush=True)\n"
       "while True: time.sleep(0.05)\n")
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control byte but \t and \n


def _clean(text: str) -> None:
    assert not RAW.search(text), f"raw control characters in output: {text!r}"


def test_list_inspect_and_errors_escape_workload_text(tmp_path: Path):
    if not criu_works():
        pytest.skip("CRIU does not work here")
    p = subprocess.Popen(["/usr/bin/python3", "-u", "-c", JOB, PAINT], stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.stdout.close()
        store = tmp_path / "store"
        store.mkdir()
        r = npusnap("checkpoint", p.pid, "-D", store / "job", "--device", "none", "--leave-running", timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        kill_and_wait(p.pid)
        p.wait(timeout=10)
    listing = npusnap("list", store, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "\\x1b" in listing.stdout  # shown, escaped
    inspect = npusnap("inspect", store / "job", timeout=60)
    assert inspect.returncode == 0, inspect.stderr
    assert "\\x1b" in inspect.stdout
    err = npusnap("verify", tmp_path / f"no{PAINT}such", timeout=60)
    assert err.returncode == 8 and "\\x1b" in err.stderr
    for r in (listing, inspect, err):
        _clean(r.stdout)
        _clean(r.stderr)
