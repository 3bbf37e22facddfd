"""Bad targets: device state but no agent (11 + the attach hint), another user's process
with the CLI run as nobody (5), restore while the pid is taken (7, nothing changed),
restore onto fewer devices or less device memory than the image needs (refused before
anything starts)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from tests.helpers import npusnap

from .support import (
    assert_failed_cleanly,
    assert_no_valid_checkpoint,
    assert_running_intact,
    proc_state,
    start_train,
    wait_progress,
)
from .test_security import as_nobody


def test_device_process_without_agent(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env, agent=False)
    try:
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ckpt", env=env, timeout=60)
        line = assert_failed_cleanly(r, {11})
        assert f"npusnap attach {w.pid}" in line, line
        assert_no_valid_checkpoint(tmp_path / "ckpt")
        wait_progress(w)
        reference.check(w.lines())
    finally:
        w.stop()


@pytest.mark.parametrize("command", ["checkpoint", "lock", "recover"])
def test_other_users_process_as_nobody(command, npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    try:
        out = tmp_path / "nobody"
        out.mkdir(mode=0o777)
        os.chmod(out, 0o777)
        args = [command, str(w.pid)] + (["-D", str(out / "ckpt")] if command == "checkpoint" else [])
        code, stderr = as_nobody(args)
        r = subprocess.CompletedProcess(args, code, "", stderr)
        assert_failed_cleanly(r, {5})
        assert_no_valid_checkpoint(out / "ckpt")
        assert_running_intact(w, reference, env)
    finally:
        w.stop()


def test_restore_while_pid_taken(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    try:
        r = npusnap("checkpoint", w.pid, "-D", target, "--leave-running", env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        before = sorted(p.name for p in target.rglob("*"))
        r = npusnap("restore", target, "--detach", env=env, timeout=60)
        assert_failed_cleanly(r, {7})
        assert sorted(p.name for p in target.rglob("*")) == before
        assert npusnap("verify", target).returncode == 0
        assert_running_intact(w, reference, env)
    finally:
        w.stop()


def _restore_watching_pid(target, pid: int, env: dict) -> tuple[subprocess.CompletedProcess, bool]:
    """Run `restore --detach` and watch whether the pid ever comes to life meanwhile."""
    seen = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if proc_state(pid) not in ("gone",):
                seen.set()
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = npusnap("restore", target, "--detach", env=env, timeout=120)
    finally:
        done.set()
        t.join(5)
    return r, seen.is_set()


@pytest.mark.parametrize("shortage", ["devices", "memory"])
def test_restore_onto_smaller_device(shortage, npusim_daemon, tmp_path):
    env = npusim_daemon.env
    device = 1 if shortage == "devices" else 0
    scratch = 4 if shortage == "devices" else 64
    w = start_train(tmp_path, env, device=device, scratch_mb=scratch)
    target = tmp_path / "ckpt"
    try:
        wait_progress(w, 2)
        r = npusnap("checkpoint", w.pid, "-D", target, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        w.proc.wait(timeout=10)
        if shortage == "devices":
            npusim_daemon.devices = 1
        else:
            npusim_daemon.memory = 32 << 20
        npusim_daemon.restart()
        r, started = _restore_watching_pid(target, w.pid, env)
        try:
            assert_failed_cleanly(r, {6, 9})
            assert npusnap("verify", target).returncode == 0
        finally:
            deadline = time.monotonic() + 10
            while proc_state(w.pid) not in ("gone", "Z") and time.monotonic() < deadline:
                time.sleep(0.05)
        assert proc_state(w.pid) in ("gone", "Z"), "a half-restored workload was left behind"
        assert not started, "the workload was started before the device shortage was noticed"
    finally:
        w.extra_pids.append(w.pid)
        w.stop()
