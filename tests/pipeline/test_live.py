"""Live checkpoints (`checkpoint --live`) end to end on a real daemon with real CRIU: the workload
runs on while its images are written behind, and the checkpoint holds the state from before the
resume (the workload rewrites its device memory during the write-behind, and the restore still
replays every step bit-exact); a failure during the write-behind leaves the workload running and
no checkpoint; Ctrl-C at random instants never loses the workload and never leaves a partial
checkpoint that looks valid (NPUSNAP_LIVE_SIGINT_TRIALS trials, 3 by default)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import npusim
import pytest

from tests.helpers import Workload, npusnap, npusnap_cmd, requires_criu, rewind_to_checkpoint

from .support import assert_no_checkpoint, interrupt, one_error_line, proc_state, status, strip_ready, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "npusim_dirty.py"
STEPS = 3


def _argv(gate: str) -> list[str]:
    return [sys.executable, str(WORKLOAD), str(STEPS), gate]


class Gated:
    """npusim_dirty.py (64 MiB of device memory), gated step by step."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.gate = tmp / "gate"
        self.gate.mkdir()
        self.w = Workload(under_agent(_argv(str(self.gate))), tmp / "dirty.out", env=env)
        self.w.wait_for_line("ready pid", timeout=60)

    def step(self, k: int) -> None:
        (self.gate / f"go-{k}").touch()
        self.w.wait_for_line(f"step {k} ", timeout=60)

    def finish(self) -> None:
        for k in range(STEPS):
            (self.gate / f"go-{k}").touch()
        assert self.w.proc.wait(timeout=60) == 0  # reaped: a zombie would hold the pid a restore needs

    def assert_running(self, env: dict[str, str]) -> None:
        assert proc_state(self.w.pid) not in ("T", "t", "Z", "gone"), proc_state(self.w.pid)
        doc = status(self.w.pid, env)
        assert doc["state"] == "RUNNING" and doc["device"]["state"] == "RUNNING", doc


@pytest.fixture
def gated(npusim_daemon, tmp_path) -> Iterator[Gated]:  # type: ignore[no-untyped-def]
    g = Gated(tmp_path, npusim_daemon.env)
    try:
        yield g
    finally:
        g.w.stop()


def _live(pid: int, ck: Path, shm: Path, *extra: str) -> list[str]:
    return [*npusnap_cmd(), "checkpoint", str(pid), "-D", str(ck), "--live", "--live-staging", str(shm),
            "--json", *extra]


def _wait_for_pause(cli: "subprocess.Popen[str] | subprocess.Popen[bytes]", err: Path, point: str) -> None:
    """The CLI (its stderr in err) announced the test pause at point and waits there."""
    deadline = time.monotonic() + 120
    while f"test pause {point}" not in err.read_text() and cli.poll() is None:
        assert time.monotonic() < deadline, err.read_text()
        time.sleep(0.05)
    assert cli.poll() is None, err.read_text()


@pytest.mark.parametrize("flags", [("--data-path", "direct"), ("--data-path", "in-process"),
                                   ("--data-path", "direct", "--dedup")], ids=["direct", "in-process", "dedup"])
def test_the_checkpoint_holds_the_state_from_before_the_resume(flags: tuple[str, ...], gated: Gated, npusim_daemon,
                                                               reference, tmp_path: Path, shm: Path) -> None:
    ref = reference(_argv("-"))
    ck, go, err = tmp_path / "ck", tmp_path / "write-behind.go", tmp_path / "ck.err"
    env = {**npusim_daemon.env, "NPUSNAP_TEST_PAUSE": "before:write-behind", "NPUSNAP_TEST_PAUSE_UNTIL": str(go),
           "NPUSNAP_TEST_PAUSE_S": "120"}
    with open(err, "w") as e:
        cli = subprocess.Popen(_live(gated.w.pid, ck, shm, *flags), env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=e, text=True)
    try:
        _wait_for_pause(cli, err, "before:write-behind")
        assert not ck.exists() and any(shm.iterdir())  # all of it in memory still
        gated.assert_running(npusim_daemon.env)
        # Resumed: two steps rewrite 14 of its 64 MiB of device memory while the images wait. A
        # step's writes are the same bytes each time it runs, but step 1 writes where step 0's
        # digest looks: a checkpoint holding any of step 1's bytes prints another step 0 line.
        gated.step(0)
        gated.step(1)
        go.touch()
        out, _ = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
    assert cli.returncode == 0, err.read_text()
    doc = json.loads(out)
    assert doc["left_running"] is True and doc["downtime_s"] > 0
    assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "resume", "write-behind", "seal"]
    assert list(shm.iterdir()) == []
    assert npusnap("verify", ck).returncode == 0
    if "--dedup" in flags:  # the page images written behind went into the store (their pack: the very files)
        assert not list((ck / "criu").glob("pages-*.img")) and list((tmp_path / ".npusnap-store" / "packs").glob("*.idx"))

    gated.finish()
    assert strip_ready(gated.w.lines()) == ref
    rewind_to_checkpoint(ck, gated.w.out)
    r = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
    assert r.returncode == 0, r.stderr
    gated.w.wait_exit(timeout=60)
    assert strip_ready(gated.w.lines()) == ref  # steps 0 and 1 again, from the device memory before them


def test_a_failure_during_the_write_behind_leaves_it_running_and_no_checkpoint(
        gated: Gated, npusim_daemon, reference, tmp_path: Path, shm: Path) -> None:
    ref = reference(_argv("-"))
    ck = tmp_path / "ck"
    r = subprocess.run(_live(gated.w.pid, ck, shm), env={**npusim_daemon.env,
                                                          "NPUSNAP_TEST_FAIL": "during:write-behind"},
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert "test failure injected at during:write-behind" in one_error_line(r.stderr)
    gated.assert_running(npusim_daemon.env)
    assert_no_checkpoint(ck)
    assert list(shm.iterdir()) == []
    gated.finish()
    assert strip_ready(gated.w.lines()) == ref  # its device memory came through whole


def test_ctrl_c_at_random_instants(gated: Gated, npusim_daemon, reference, tmp_path: Path, shm: Path) -> None:
    ref = reference(_argv("-"))
    env = npusim_daemon.env
    seed = int(os.environ.get("NPUSNAP_LIVE_SIGINT_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    t0 = time.monotonic()
    first = subprocess.run(_live(gated.w.pid, tmp_path / "ck-timed", shm), env=env, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert first.returncode == 0, first.stderr
    span = time.monotonic() - t0  # the instants fall anywhere in a whole checkpoint
    outcomes = []
    for i in range(int(os.environ.get("NPUSNAP_LIVE_SIGINT_TRIALS") or 3)):
        ck = tmp_path / f"ck{i}"
        cli = subprocess.Popen(_live(gated.w.pid, ck, shm), env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = interrupt(cli, rng.uniform(0, span))
        outcomes.append(cli.returncode)
        why = f"seed {seed}, trial {i}: exit {cli.returncode}: {stderr}"
        if cli.returncode == 0:  # the signal came before the CLI's handlers, or after the commit
            assert npusnap("verify", ck).returncode == 0, why
        else:
            leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith((ck.name, f".{ck.name}."))]
            assert not leftovers, why  # the outcome reported is the one that happened, and nothing is left
        gated.assert_running(env)
        assert list(shm.iterdir()) == [], why
    print(f"seed {seed}: exits {outcomes}")
    gated.finish()
    assert strip_ready(gated.w.lines()) == ref


def test_the_cli_killed_while_the_images_are_in_memory(gated: Gated, npusim_daemon, reference, tmp_path: Path,
                                                       shm: Path) -> None:
    """SIGKILL after the dump, the workload stopped and its device data only in memory: the guardian
    resumes it, gives its device back the memory the daemon kept (`npusnap recover`), has the daemon
    drop the snapshot, and removes the images in the tmpfs and the staging."""
    ref = reference(_argv("-"))
    ck, err = tmp_path / "ck", tmp_path / "ck.err"
    env = {**npusim_daemon.env, "NPUSNAP_TEST_PAUSE": "after:dump", "NPUSNAP_TEST_PAUSE_S": "120"}
    with open(err, "w") as e:
        cli = subprocess.Popen(_live(gated.w.pid, ck, shm), env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=e)
    try:
        _wait_for_pause(cli, err, "after:dump")
        assert proc_state(gated.w.pid) in ("T", "t") and any(shm.iterdir())
    finally:
        cli.kill()
        cli.wait()
    deadline = time.monotonic() + 120
    while any(shm.iterdir()) or status(gated.w.pid, npusim_daemon.env)["device"]["state"] != "RUNNING" or \
            npusim.daemon_status(npusim_daemon.socket)["snapshots"] != 0:
        assert time.monotonic() < deadline, "the guardian did not recover the workload in 120 s"
        time.sleep(0.2)
    gated.assert_running(npusim_daemon.env)
    assert_no_checkpoint(ck)
    gated.finish()
    assert strip_ready(gated.w.lines()) == ref
