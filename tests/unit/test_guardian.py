"""The guardian (core/guardian.py), a real process, told what a checkpoint is doing and then left
without its "done" (our death): before the commit's rename it resumes the tree CRIU left stopped
and removes the partial checkpoint; once the rename happened the checkpoint stands and the tree
ends as the command would have finished it (killed, or with --leave-running running on)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from npusnap_cli.core.guardian import Guardian


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


def wait_for(check, what: str, bound: float = 10) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def died(g: Guardian) -> None:
    """Our death as the guardian sees it: its pipe closes without the word done."""
    assert g.proc.stdin is not None
    g.proc.stdin.close()
    g.proc.wait(timeout=30)


@pytest.mark.parametrize("renamed,kills,outcome", [(False, True, "resumed"), (True, True, "killed"),
                                                    (True, False, "resumed")])
def test_a_death_around_the_commit_ends_in_the_outcome_of_the_rename(tmp_path: Path, renamed: bool, kills: bool,
                                                                     outcome: str) -> None:
    staging, final = tmp_path / ".ck.partial", tmp_path / "ck"
    staging.mkdir()
    (staging / "manifest.yaml").write_text("written last\n")
    tree = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(tree.pid, signal.SIGSTOP)  # as CRIU leaves a dumped tree
        wait_for(lambda: state(tree.pid) == "T", "the tree did not stop")
        g = Guardian(staging, tree.pid)
        g.watch([tree.pid])
        g.committing(staging, final, kills)
        if renamed:
            staging.rename(final)
        died(g)
        if outcome == "killed":
            assert tree.wait(timeout=10) == -signal.SIGKILL
        else:
            wait_for(lambda: state(tree.pid) in ("S", "R"), f"the tree is {state(tree.pid)}, not resumed")
        assert (final / "manifest.yaml").exists() == renamed  # the checkpoint stands, or never was
        assert not staging.exists()  # the partial checkpoint is removed
    finally:
        tree.kill()
        tree.wait()
