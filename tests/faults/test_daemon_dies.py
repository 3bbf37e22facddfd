"""The device daemon dies: during the backup, during a restore, while the workload is
locked. Device data cannot survive in a dead daemon, so the assertions are what must
still hold: one error line, a documented exit code, nothing waits forever, the workload
is not left locked or stopped, and no valid-looking checkpoint is left behind (and a
good checkpoint stays good)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import npusnap, npusnap_cmd

from .conftest import NOTES
from .support import (
    PausedCli,
    assert_failed_cleanly,
    assert_no_valid_checkpoint,
    proc_state,
    start_train,
    status,
    wait_progress,
)


def kill_daemon(daemon) -> None:  # type: ignore[no-untyped-def]
    assert daemon.proc is not None
    daemon.proc.kill()
    daemon.proc.wait(timeout=10)


def not_stuck(pid: int, env: dict, bound: float = 20) -> str:
    """Within bound the workload has either exited (its device is gone) or runs unlocked,
    not stopped. Returns what happened."""
    deadline = time.monotonic() + bound
    while True:
        st = proc_state(pid)
        if st in ("gone", "Z"):
            return "exited"
        if st not in ("T", "t"):
            try:
                doc = status(pid, env)
            except AssertionError:
                doc = None  # it exited between the two looks
            if doc is not None and doc["state"] == "RUNNING" and not doc["stopped"]:
                return "running"
        assert time.monotonic() < deadline, f"workload {pid} still {st} after {bound} s"
        time.sleep(0.1)


def wait_log(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.002)


def test_daemon_dies_during_backup(npusim_daemon, tmp_path):
    env = npusim_daemon.env
    log = tmp_path / "agent.log"
    w = start_train(tmp_path, env, agent_log=log, scratch_mb=512)
    target = tmp_path / "ckpt"
    cli = subprocess.Popen([*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(target)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
    try:
        wait_log(log, "-> ok=1 code=0 state=LOCKED")  # the lock is done: the backup starts now
        kill_daemon(npusim_daemon)
        out, err = cli.communicate(timeout=120)
        r = subprocess.CompletedProcess(cli.args, cli.returncode, out, err)
        if r.returncode == 0:  # the backup won the race: then it must be a good checkpoint
            NOTES.append("daemon-dies-during-backup: the backup finished before the daemon died")
            assert npusnap("verify", target).returncode == 0
            return
        assert_failed_cleanly(r, {9})
        assert_no_valid_checkpoint(target)
        not_stuck(w.pid, env)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        w.stop()


def test_daemon_dies_during_restore(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env, scratch_mb=512)
    target = tmp_path / "ckpt"
    restore = None
    try:
        n = wait_progress(w, 3)
        r = npusnap("checkpoint", w.pid, "-D", target, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert proc_state(w.pid) in ("gone", "Z")
        w.proc.wait(timeout=10)
        restore = subprocess.Popen([*npusnap_cmd(), "restore", str(target), "--detach"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
        deadline = time.monotonic() + 60
        while not os.path.exists(f"/proc/{w.pid}"):  # CRIU has put the process back
            assert time.monotonic() < deadline and restore.poll() is None, restore.stderr.read()
            time.sleep(0.001)
        kill_daemon(npusim_daemon)
        out, err = restore.communicate(timeout=120)
        rr = subprocess.CompletedProcess(restore.args, restore.returncode, out, err)
        assert_failed_cleanly(rr, {9})
        # the half-restored process is not left behind, and the checkpoint is still good
        deadline = time.monotonic() + 15
        while proc_state(w.pid) not in ("gone", "Z"):
            assert time.monotonic() < deadline, f"half-restored {w.pid} still {proc_state(w.pid)}"
            time.sleep(0.05)
        assert npusnap("verify", target).returncode == 0
        # once a daemon is back, the same checkpoint restores with the device data intact
        npusim_daemon.start()
        r = npusnap("restore", target, "--detach", env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        w.extra_pids.append(w.pid)
        wait_progress(w, 3)
        assert status(w.pid, env)["state"] == "RUNNING"
        reference.check(w.lines())
        assert len([x for x in w.lines() if x.startswith("step ")]) > n
    finally:
        if restore is not None and restore.poll() is None:
            restore.kill()
            restore.wait()
        w.stop()


def test_daemon_dies_while_locked_runbook(npusim_daemon, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    try:
        assert npusnap("lock", w.pid, env=env).returncode == 0
        kill_daemon(npusim_daemon)
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ckpt", env=env, timeout=60)
        assert_failed_cleanly(r, {11})  # refused: it is LOCKED (recover first)
        assert_no_valid_checkpoint(tmp_path / "ckpt")
        r = npusnap("recover", w.pid, env=env, timeout=60)
        if r.returncode != 0:
            assert_failed_cleanly(r, {9})
        not_stuck(w.pid, env)
    finally:
        w.stop()


def test_daemon_dies_while_checkpoint_holds_the_lock(npusim_daemon, tmp_path):
    """Paused with the workload locked (before BACKUP), the daemon dies, then Ctrl-C: the
    rollback (unlock) must still finish."""
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    cli = None
    try:
        cli = PausedCli(["checkpoint", w.pid, "-D", target], "before:backup", env)
        kill_daemon(npusim_daemon)
        cli.proc.send_signal(signal.SIGINT)
        out, err = cli.proc.communicate(timeout=60)
        r = subprocess.CompletedProcess(cli.proc.args, cli.proc.returncode, out.decode(), cli.stderr + err.decode())
        assert_failed_cleanly(r, {130})
        assert_no_valid_checkpoint(target)
        not_stuck(w.pid, env)
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        w.stop()

