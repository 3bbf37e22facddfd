"""Checkpoint/restore of processes without device state, with real CRIU."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    WORKLOADS,
    Workload,
    build_c,
    npusnap,
    pid_alive,
    proc_state,
    requires_criu,
    rewind_to_checkpoint,
)

pytestmark = requires_criu

# After "step 3" the workload must outlive a CLI start and CRIU's seize on a loaded machine: with
# 60 ms steps it once finished mid-dump ("Unable to detach from PID: No such process").
STEPS, SLEEP_MS, EXIT = 12, 150, 7


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(WORKLOADS / "mutate.c", tmp_path_factory.mktemp("bin") / "mutate")


@pytest.fixture(params=["c", "python"])
def argv(request: pytest.FixtureRequest, c_binary: Path) -> list[str]:
    prog = [str(c_binary)] if request.param == "c" else [sys.executable, str(WORKLOADS / "mutate.py")]
    return [*prog, str(STEPS), str(SLEEP_MS), str(EXIT)]


@pytest.fixture
def reference(argv: list[str], tmp_path: Path) -> list[str]:
    w = Workload(argv, tmp_path / "reference.out")
    try:
        assert w.proc.wait(timeout=60) == EXIT
        return w.lines()
    finally:
        w.stop()


def test_checkpoint_kill_restore_continues_exactly(argv: list[str], reference: list[str], tmp_path: Path) -> None:
    w = Workload(argv, tmp_path / "run.out")
    try:
        w.wait_for_line("step 3 ")
        ck = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--json", check=True)
        doc = json.loads(ck.stdout)
        assert doc["kind"] == "checkpoint" and doc["pid"] == w.pid and doc["bytes"] >= 64 << 20
        w.proc.wait(timeout=10)  # checkpoint kills the original, like `criu dump`
        assert not pid_alive(w.pid)
        assert (tmp_path / "ck" / "manifest.yaml").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "ck").stat().st_mode & 0o777 == 0o700
        # Foreground restore waits and passes the workload's exit code through.
        rs = npusnap("restore", tmp_path / "ck", timeout=60)
        assert rs.returncode == EXIT, rs.stderr
        assert w.lines() == reference
    finally:
        w.stop()


def test_leave_running_then_restore_the_image(argv: list[str], reference: list[str], tmp_path: Path) -> None:
    w = Workload(argv, tmp_path / "run.out")
    try:
        w.wait_for_line("step 2 ")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--leave-running", check=True)
        assert w.proc.wait(timeout=60) == EXIT  # the original carries on to the end
        assert w.lines() == reference
        rewind_to_checkpoint(tmp_path / "ck", w.out)
        rs = npusnap("restore", tmp_path / "ck", "--detach", "--pidfile", tmp_path / "pid", "--json", check=True)
        assert json.loads(rs.stdout)["pid"] == w.pid == int((tmp_path / "pid").read_text())
        w.wait_exit()
        assert w.lines() == reference  # the restored copy rewrote the same tail
    finally:
        w.stop()


def test_a_process_stopped_when_checkpointed_comes_back_stopped(argv: list[str], reference: list[str],
                                                                 tmp_path: Path) -> None:
    """The restore leaves a verified tree stopped only to resume it: a process that was stopped at
    the checkpoint must stay stopped (no stray SIGCONT), and carry on exactly once continued."""
    w = Workload(argv, tmp_path / "run.out")
    try:
        w.wait_for_line("step 3 ")
        os.kill(w.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while proc_state(w.pid) not in ("T", "t") and time.monotonic() < deadline:
            time.sleep(0.01)
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", check=True)
        w.proc.wait(timeout=10)
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        assert proc_state(w.pid) in ("T", "t")
        os.kill(w.pid, signal.SIGCONT)
        w.wait_exit()
        assert w.lines() == reference
    finally:
        w.stop()


def test_a_damaged_page_image_never_runs(c_binary: Path, tmp_path: Path) -> None:
    """Page images are verified while CRIU reads them: the tree CRIU restored from a damaged one
    was stopped from its start and is killed, its pid free when the command returns."""
    w = Workload([str(c_binary), "1000", "50"], tmp_path / "run.out")
    try:
        w.wait_for_line("step 1 ")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", check=True)
        w.proc.wait(timeout=10)
        before = w.out.read_bytes()
        [pages] = (tmp_path / "ck" / "criu").glob("pages-*.img")
        data = bytearray(pages.read_bytes())
        data[len(data) // 2] ^= 0x01
        pages.write_bytes(bytes(data))
        r = npusnap("restore", tmp_path / "ck", "--detach")
        assert r.returncode == 8 and f"criu/{pages.name}: checksum mismatch" in r.stderr, r.stderr
        assert proc_state(w.pid) == "gone" and w.out.read_bytes() == before
    finally:
        w.stop()


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory, c_binary: Path) -> Path:
    tmp = tmp_path_factory.mktemp("ck")
    w = Workload([str(c_binary), "1000", "50"], tmp / "out")
    try:
        w.wait_for_line("step 1 ")
        npusnap("checkpoint", w.pid, "-D", tmp / "ck", check=True)
    finally:
        w.stop()
    return tmp / "ck"


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_verify_accepts_a_good_checkpoint(checkpoint_dir: Path) -> None:
    r = npusnap("verify", checkpoint_dir, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["valid"] is True


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_image_is_refused(checkpoint_dir: Path, tmp_path: Path, damage: str) -> None:
    ck = _copy(checkpoint_dir, tmp_path / "ck")
    for img in sorted((ck / "criu").iterdir()):
        victim = _copy(ck, tmp_path / f"bad-{img.name}")
        target = victim / "criu" / img.name
        data = bytearray(target.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x01
        else:
            data = data[: len(data) - 1]
        target.write_bytes(bytes(data))
        v = npusnap("verify", victim)
        assert v.returncode == 8, (img.name, v.stderr)
        assert f"criu/{img.name}" in v.stderr and len(v.stderr.strip().splitlines()) == 1
        r = npusnap("restore", victim, "--detach")
        assert r.returncode == 8 and "Traceback" not in r.stderr
