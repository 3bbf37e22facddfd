"""A chunk store (--dedup) in a directory other users can write: a real second user plants
`.npusnap-store` first, as a directory of theirs with a pack and an index that claim chunks, or
as a link to one. npusnap refuses to use it (exit 12, one line), never writes into it, leaves no
checkpoint, and the workload runs on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.faults.support import assert_failed_cleanly, assert_no_valid_checkpoint
from tests.helpers import Workload, criu_works, npusnap, proc_state
from tests.users import as_user, other_user, traversable

pytestmark = pytest.mark.criu

LOOP = "import time\ni = 0\nwhile True:\n    print(i, flush=True); i += 1; time.sleep(0.05)\n"


def _plant_store(shared: str) -> None:
    """The attacker's store: world-writable, a pack and an index claiming a chunk of zeros."""
    store = Path(shared) / ".npusnap-store"
    (store / "packs").mkdir(parents=True)
    pack = "0" * 16 + "-1-00000000"
    (store / "packs" / f"{pack}.pack").write_bytes(b"evil" * 16384)
    (store / "packs" / f"{pack}.idx").write_text(f"{'ab' * 16} raw 0 65536\n")
    for p in (store, store / "packs"):
        os.chmod(p, 0o777)


def _plant_link(shared: str) -> None:
    theirs = Path(shared) / "theirs"
    theirs.mkdir(mode=0o700)
    os.symlink(theirs, Path(shared) / ".npusnap-store")


@pytest.mark.parametrize("plant", [_plant_store, _plant_link], ids=["their-directory", "a-link"])
def test_a_store_planted_by_another_user_is_refused(plant, tmp_path: Path) -> None:
    if not criu_works():
        pytest.skip("CRIU does not work here")
    shared = tmp_path / "shared"
    shared.mkdir()
    traversable(shared)
    os.chmod(shared, 0o1777)  # as /tmp: anyone may create, only the owner may remove
    as_user(other_user(), plant, str(shared))
    planted = sorted((shared / ".npusnap-store").resolve().rglob("*"))
    before = {p: p.stat().st_mtime_ns for p in planted}
    w = Workload([sys.executable, "-u", "-c", LOOP], tmp_path / "w.out")
    try:
        w.wait_for_line(3)
        r = npusnap("checkpoint", w.pid, "-D", shared / "ck", "--device", "none", "--dedup", timeout=120)
        line = assert_failed_cleanly(r, {12})
        assert "chunk store" in line and "Traceback" not in r.stderr, r.stderr
        assert_no_valid_checkpoint(shared / "ck")
        assert proc_state(w.pid) in ("R", "S"), proc_state(w.pid)  # running on, not stopped
        after = sorted((shared / ".npusnap-store").resolve().rglob("*"))
        assert after == planted and {p: p.stat().st_mtime_ns for p in after} == before  # nothing written there
    finally:
        w.stop()
