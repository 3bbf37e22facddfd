"""Live checkpoints of a process set (`checkpoint PID PID --live`) end to end on a real daemon with
real CRIU: every member runs on, unlocked, while the set's images are written behind, and the
checkpoint holds every member's state from before the resume (each member rewrites its device
memory during the write-behind, and the set's restore still replays every step bit-exact); a set
that would not fit in the staging falls back to an ordinary --leave-running set checkpoint with
one process's warning; a failure during the write-behind leaves every member running and no
checkpoint; the CLI killed while the set is in memory leaves every member recovered by the
guardian. Signals at random instants: tests/faults/test_live_set_faults.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Iterator

import npusim
import pytest
import yaml

from tests.helpers import npusnap, npusnap_cmd, requires_criu, rewind_to_checkpoint

from .support import assert_no_checkpoint, one_error_line, proc_state, status, strip_ready
from .test_live import Gated, _argv, _wait_for_pause

pytestmark = [requires_criu, pytest.mark.criu]

MEMBERS = 2


@pytest.fixture
def members(npusim_daemon, tmp_path) -> Iterator[list[Gated]]:  # type: ignore[no-untyped-def]
    gs: list[Gated] = []
    try:
        for i in range(MEMBERS):
            (tmp_path / f"m{i}").mkdir()
            gs.append(Gated(tmp_path / f"m{i}", npusim_daemon.env))
        yield gs
    finally:
        for g in gs:
            g.w.stop()


def _live_set(gs: list[Gated], ck: Path, staging: Path, *extra: str) -> list[str]:
    return [*npusnap_cmd(), "checkpoint", *(str(g.w.pid) for g in gs), "-D", str(ck), "--live",
            "--live-staging", str(staging), "--json", *extra]


def _snapshots(socket: str) -> int:
    return int(dict(npusim.daemon_status(socket))["snapshots"])


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_the_set_holds_every_members_state_from_before_the_resume(data_path: str, members: list[Gated],
                                                                  npusim_daemon, reference, tmp_path: Path,
                                                                  shm: Path) -> None:
    ref = reference(_argv("-"))
    ck, go, err = tmp_path / "ck", tmp_path / "write-behind.go", tmp_path / "ck.err"
    env = {**npusim_daemon.env, "NPUSNAP_TEST_PAUSE": "before:write-behind", "NPUSNAP_TEST_PAUSE_UNTIL": str(go),
           "NPUSNAP_TEST_PAUSE_S": "120"}
    with open(err, "w") as e:
        cli = subprocess.Popen(_live_set(members, ck, shm, "--data-path", data_path), env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=e, text=True)
    try:
        _wait_for_pause(cli, err, "before:write-behind")
        assert not ck.exists() and any(shm.iterdir())  # every member's images in memory still
        for g in members:  # every member runs on, unlocked, before anything reached the disk
            g.assert_running(npusim_daemon.env)
        # Each member's steps 0 and 1 rewrite 14 of its 64 MiB of device memory while the images
        # wait (its copy-on-write snapshot copies aside on the direct path): a checkpoint holding
        # any of step 1's bytes prints another step 0 line after the restore.
        for g in members:
            g.step(0)
            g.step(1)
        go.touch()
        out, _ = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
    assert cli.returncode == 0, err.read_text()
    doc = json.loads(out)
    assert doc["pids"] == [g.w.pid for g in members] and doc["left_running"] is True
    assert doc["downtime_s"] > 0
    assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "resume", "write-behind", "seal"]
    assert all(m["device"]["method"] == data_path for m in doc["members"])
    assert list(shm.iterdir()) == []
    assert _snapshots(npusim_daemon.socket) == 0
    m = yaml.safe_load((ck / "manifest.yaml").read_text())
    assert m["options"]["live"]["downtime_s"] == doc["downtime_s"]
    for g in members:
        assert (data_path == "direct") == any(f["path"].startswith(f"device/{g.w.pid}/") for f in m["files"])
    assert npusnap("verify", ck).returncode == 0

    for g in members:
        g.finish()
        assert strip_ready(g.w.lines()) == ref
        rewind_to_checkpoint(ck, g.w.out, member=g.w.pid)
    r = npusnap("restore", ck, env=npusim_daemon.env, timeout=180)
    assert r.returncode == 0, r.stderr
    for g in members:
        g.w.wait_exit(timeout=60)
        assert strip_ready(g.w.lines()) == ref  # steps 0 and 1 again, from the device memory before them


def test_a_set_that_does_not_fit_falls_back_with_one_warning(members: list[Gated], npusim_daemon, tmp_path: Path,
                                                             reference) -> None:
    """The staging is not a tmpfs here; the room check (the sum of every member's device and
    resident bytes) is tests/unit/test_live_set.py's."""
    ref = reference(_argv("-"))
    r = subprocess.run(_live_set(members, tmp_path / "ck", tmp_path, "--data-path", "direct"),
                       env=npusim_daemon.env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["warnings"] == [f"not live: {tmp_path} is not a tmpfs; the workload stays stopped for the "
                               "whole checkpoint"]
    assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "seal"] and doc["downtime_s"] is None
    assert "live" not in yaml.safe_load((tmp_path / "ck" / "manifest.yaml").read_text())["options"]
    for g in members:
        g.assert_running(npusim_daemon.env)
        g.finish()
        assert strip_ready(g.w.lines()) == ref


def test_a_failure_during_the_write_behind_leaves_every_member_running_and_no_checkpoint(
        members: list[Gated], npusim_daemon, reference, tmp_path: Path, shm: Path) -> None:
    ref = reference(_argv("-"))
    ck = tmp_path / "ck"
    r = subprocess.run(_live_set(members, ck, shm, "--data-path", "direct"),
                       env={**npusim_daemon.env, "NPUSNAP_TEST_FAIL": "during:write-behind"},
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert r.returncode == 3, r.stderr
    assert "test failure injected at during:write-behind" in one_error_line(r.stderr)
    assert_no_checkpoint(ck)
    assert list(shm.iterdir()) == [] and _snapshots(npusim_daemon.socket) == 0
    for g in members:
        g.assert_running(npusim_daemon.env)
        g.finish()
        assert strip_ready(g.w.lines()) == ref  # its device memory came through whole


@pytest.mark.parametrize("point", ["after:dump", "before:write-behind"])
def test_the_cli_killed_while_the_set_is_in_memory(point: str, members: list[Gated], npusim_daemon, reference,
                                                   tmp_path: Path, shm: Path) -> None:
    """SIGKILL after the dump, every member stopped and its device data kept by the daemon: the
    guardian resumes every member, gives each its device memory back (`npusnap recover PID`), has
    the daemon drop every snapshot, and removes the images in the tmpfs and the staging. After the
    set's resume (before the write-behind) every member runs on already: the guardian only drops
    the snapshots and removes what is left."""
    ref = reference(_argv("-"))
    ck, err = tmp_path / "ck", tmp_path / "ck.err"
    env = {**npusim_daemon.env, "NPUSNAP_TEST_PAUSE": point, "NPUSNAP_TEST_PAUSE_S": "120"}
    with open(err, "w") as e:
        cli = subprocess.Popen(_live_set(members, ck, shm, "--data-path", "direct"), env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=e)
    try:
        _wait_for_pause(cli, err, point)
        stopped = [proc_state(g.w.pid) in ("T", "t") for g in members]
        assert stopped == [point == "after:dump"] * MEMBERS and any(shm.iterdir())
        assert _snapshots(npusim_daemon.socket) == MEMBERS
    finally:
        cli.kill()
        cli.wait()
    deadline = time.monotonic() + 120
    while any(shm.iterdir()) or _snapshots(npusim_daemon.socket) != 0 or \
            any(status(g.w.pid, npusim_daemon.env)["device"]["state"] != "RUNNING" for g in members):
        assert time.monotonic() < deadline, "the guardian did not recover the set in 120 s"
        time.sleep(0.2)
    assert_no_checkpoint(ck)
    for g in members:
        g.assert_running(npusim_daemon.env)
        g.finish()
        assert strip_ready(g.w.lines()) == ref
