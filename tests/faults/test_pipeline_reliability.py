"""Pipeline reliability beyond the phase boundaries: a signal at the commit point, a CLI
stopped past its lease (fencing), a restore interrupted between CRIU and the unlock, a
tree that forks while it is checkpointed, and `recover` from every state a direct-path
restore can leave behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from npusnap_cli.image.format import load_manifest
from tests.helpers import Workload, npusnap, npusnap_cmd, pid_alive, requires_criu, rewind_to_checkpoint

from .support import (
    PausedCli,
    assert_failed_cleanly,
    assert_no_valid_checkpoint,
    assert_running_intact,
    proc_state,
    start_train,
    wait_recovers,
)

pytestmark = [requires_criu, pytest.mark.criu]


def _finish(cli: PausedCli, timeout: float = 90) -> subprocess.CompletedProcess:
    out, err = cli.proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cli.proc.args, cli.proc.returncode, out.decode(), cli.stderr + err.decode())


def _reap_cli(cli: "PausedCli | None") -> None:
    if cli is not None:
        if cli.proc.poll() is None:
            os.kill(cli.proc.pid, signal.SIGCONT)
            cli.kill()
        else:
            cli.proc.wait()


def _wait_gone(pid: int, bound: float = 15) -> None:
    deadline = time.monotonic() + bound
    while True:
        try:
            os.waitpid(pid, os.WNOHANG)  # our own child (the first incarnation): reap it, free its pid
        except ChildProcessError:
            pass
        if not pid_alive(pid) and proc_state(pid) == "gone":
            return
        assert time.monotonic() < deadline, f"process {pid} still there ({proc_state(pid)}) after {bound} s"
        time.sleep(0.05)


def _tagged(tag: str) -> list[tuple[int, str]]:
    """(pid, state) of every process whose environment carries NPUSNAP_TEST_TAG=tag."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"NPUSNAP_TEST_TAG={tag}".encode() in env:
            found.append((int(d.name), proc_state(int(d.name))))
    return found


def _kill_tagged(tag: str) -> None:
    for pid, _ in _tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("leave_running", [False, True], ids=["kill", "leave-running"])
def test_signal_at_commit_point_keeps_the_checkpoint(leave_running, npusim_daemon, reference, tmp_path):
    """SIGINT held across the commit: the checkpoint stands and is reported as it happened
    (it was reported rolled back, and the undo imported from the renamed staging path)."""
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    cli = None
    try:
        args = ["checkpoint", w.pid, "-D", target] + (["--leave-running"] if leave_running else [])
        cli = PausedCli(args, "commit", env)
        cli.proc.send_signal(signal.SIGINT)
        r = _finish(cli)
        assert r.returncode == 0, r.stderr
        assert "rolled back" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert npusnap("verify", target, env=env).returncode == 0
        if leave_running:
            assert_running_intact(w, reference, env)
        else:
            _wait_gone(w.pid)
    finally:
        _reap_cli(cli)
        w.stop()


def wait_lease_lost(pid: int, bound: float = 60) -> None:
    """Until the agent says the lease ran out: in the process's run time, which a loaded host's
    ticker counts late (at most 100 ms a wakeup, agent.c), so no fixed sleep is sure to outlast it."""
    from npusnap_cli.platform.agent import AgentClient

    deadline = time.monotonic() + bound
    while not AgentClient(pid).status().lease_lost:
        assert time.monotonic() < deadline, f"the lease of process {pid} did not run out in {bound} s"
        time.sleep(0.1)


def stopped_past_the_lease(cli: PausedCli, pid: int) -> subprocess.CompletedProcess:
    """The paused CLI stopped (Ctrl-Z) until the lease on pid's lock ran out, then let go to its end."""
    os.kill(cli.proc.pid, signal.SIGSTOP)
    wait_lease_lost(pid)
    os.kill(cli.proc.pid, signal.SIGCONT)
    return _finish(cli)


@contextlib.contextmanager
def checkpoint_stopped_past_its_lease(tmp_path: Path, env: dict[str, str], point: str,
                                      *options: str) -> Iterator[tuple[Workload, subprocess.CompletedProcess]]:
    """A training workload, and the outcome of its `npusnap checkpoint -D tmp_path/ckpt --lease 1
    OPTIONS` stopped at point until the lease ran out (the workload runs on, locked, past it); both
    reaped after."""
    w = start_train(tmp_path, env)
    cli = None
    try:
        cli = PausedCli(["checkpoint", w.pid, "-D", tmp_path / "ckpt", "--lease", "1", *options], point,
                        {**env, "NPUSNAP_TEST_PAUSE_S": "1"})
        yield w, stopped_past_the_lease(cli, w.pid)
    finally:
        _reap_cli(cli)
        w.stop()


def checkpointed(w: Workload, target: Path, data_path: str, env: dict[str, str]) -> None:
    """w checkpointed into target (default mode), and gone."""
    r = npusnap("checkpoint", w.pid, "-D", target, "--data-path", data_path, env=env)
    assert r.returncode == 0, r.stderr
    _wait_gone(w.pid)


@contextlib.contextmanager
def restore_paused(tmp_path: Path, env: dict[str, str], data_path: str, point: str,
                   pause_s: "str | None" = None) -> Iterator[tuple[Workload, Path, PausedCli]]:
    """A training workload checkpointed into tmp_path/ckpt, and `npusnap restore -d` of it paused
    at point (for pause_s seconds, if given): (the workload, the checkpoint, the CLI); both reaped after."""
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    cli = None
    try:
        checkpointed(w, target, data_path, env)
        cli = PausedCli(["restore", "-d", target], point,
                        env if pause_s is None else {**env, "NPUSNAP_TEST_PAUSE_S": pause_s})
        yield w, target, cli
    finally:
        _reap_cli(cli)
        w.stop()


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
@pytest.mark.parametrize("point", ["after:backup", "before:dump"])
def test_cli_stopped_past_its_lease_stops_and_says_so(point, data_path, npusim_daemon, reference, tmp_path):
    """Ctrl-Z of the CLI after the device backup, longer than the lease: the CLI that lost the
    lease stops (one line, exit 9), the workload runs with its data, and on the direct path
    the staged device data was put back before anything was deleted. before:dump: after the
    dump's own renewal, before CRIU's freeze (renewals held until it): the frozen process's memory
    says the agent took it back, which CRIU would otherwise have dumped as it was then, no longer
    backed up, in a checkpoint that looked valid."""
    with checkpoint_stopped_past_its_lease(tmp_path, npusim_daemon.env, point, "--data-path", data_path) as (w, r):
        line = assert_failed_cleanly(r, {9})
        assert "lease" in line, line
        assert_no_valid_checkpoint(tmp_path / "ckpt")
        wait_recovers(w, bound=30, env=npusim_daemon.env)
        assert_running_intact(w, reference, npusim_daemon.env)


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_cli_stopped_past_its_lease_after_the_commit_succeeds(data_path, npusim_daemon, reference, tmp_path):
    """--leave-running, the CLI stopped after the commit, the device's data back, before its
    unlock, longer than the lease: the agent unlocks by itself (the daemon lets it, the memory
    being in place), and the CLI, finding it running, reports the checkpoint it committed
    (it tried an import into the unlocked process and reported a failure)."""
    with checkpoint_stopped_past_its_lease(tmp_path, npusim_daemon.env, "device-unlock", "--data-path", data_path,
                                           "--leave-running") as (w, r):
        assert r.returncode == 0, r.stderr
        assert npusnap("verify", tmp_path / "ckpt", env=npusim_daemon.env).returncode == 0
        wait_recovers(w, bound=30, env=npusim_daemon.env)
        assert_running_intact(w, reference, npusim_daemon.env)


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_restore_stopped_past_its_lease_before_the_unlock_succeeds(data_path, npusim_daemon, reference, tmp_path):
    """The restore's CLI stopped with the device's data back, before its unlock, longer than the
    lease it keeps on the restored lock (10 s): the agent unlocks by itself, and the restore stands
    (it reported a refused unlock and killed the restored tree, which ran intact)."""
    with restore_paused(tmp_path, npusim_daemon.env, data_path, "device-unlock", pause_s="1") as (w, _, cli):
        r = stopped_past_the_lease(cli, w.pid)
        assert r.returncode == 0, r.stderr
        assert_running_intact(w, reference, npusim_daemon.env)


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_restore_interrupted_before_unlock(how, data_path, npusim_daemon, reference, tmp_path):
    """The CLI dies or is interrupted between CRIU's restore and the unlock: the restored tree
    is gone (not LOCKED forever holding the pids), and the checkpoint restores again."""
    env = npusim_daemon.env
    with restore_paused(tmp_path, env, data_path, "after:criu-restore") as (w, target, cli):
        assert pid_alive(w.pid)
        if how == "SIGKILL":
            cli.kill()
        else:
            cli.proc.send_signal(signal.SIGINT)
            assert_failed_cleanly(_finish(cli), {130})
        _wait_gone(w.pid)  # the guardian (SIGKILL) or the rollback (SIGINT) took it away
        assert npusnap("verify", target, env=env).returncode == 0
        rewind_to_checkpoint(target, w.out)
        r = npusnap("restore", "-d", target, env=env)
        assert r.returncode == 0, r.stderr
        assert_running_intact(w, reference, env)


def _child_named(parent: int, comm: str) -> "int | None":
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat.rpartition(")")[2].split()
            if name == comm and int(rest[1]) == parent:
                return int(d.name)
    return None


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_cli_killed_while_criu_restores(data_path, npusim_daemon, reference, tmp_path):
    """SIGKILL of the CLI while `criu swrk` is still restoring: the guardian waits for CRIU to
    finish, then takes the half-restored tree away, so the checkpoint restores again."""
    env = npusim_daemon.env
    w = start_train(tmp_path, env, ballast_mb=256)  # a restore that takes CRIU a moment
    target = tmp_path / "ckpt"
    cli = None
    try:
        checkpointed(w, target, data_path, env)
        cli = subprocess.Popen([*npusnap_cmd(), "restore", "-d", str(target)], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        criu = None
        while criu is None and cli.poll() is None and time.monotonic() < deadline:
            criu = _child_named(cli.pid, "criu")
            time.sleep(0.002)
        assert criu is not None, "never saw CRIU restoring"
        cli.kill()
        cli.wait()
        # CRIU finishes (until then the tree may not even exist yet), then the guardian kills what
        # it restored: every process of it gone, reaped by process 1 (the CLI, their subreaper, is
        # dead), which does so in its own time (here, process_api: now and then).
        _wait_gone(criu, bound=60)
        for p in load_manifest(target).processes:
            _wait_gone(p.pid, bound=60)
        assert npusnap("verify", target, env=env).returncode == 0
        rewind_to_checkpoint(target, w.out)
        r = npusnap("restore", "-d", target, env=env)
        assert r.returncode == 0, r.stderr
        assert_running_intact(w, reference, env)
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        w.stop()


@pytest.mark.parametrize("state", ["BACKED_UP", "failed-import"])
def test_recover_direct_path_states(state, npusim_daemon, reference, tmp_path):
    """`recover --device-images` brings a direct-path restore back from BACKED_UP and from
    LOCKED after a failed import (the daemon refuses Unlock until the data is in)."""
    from npusnap_cli.errors import NpusnapError
    from npusnap_cli.platform import simimages
    from npusnap_cli.platform.agent import AgentClient

    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    try:
        r = npusnap("checkpoint", w.pid, "-D", target, "--data-path", "direct", env=env)
        assert r.returncode == 0, r.stderr
        _wait_gone(w.pid)
        r = npusnap("restore", "-d", "--criu-only", target, env=env)
        assert r.returncode == 0, r.stderr
        if state == "failed-import":
            bad = tmp_path / "bad-device"
            bad.mkdir()
            for f in (target / "device").iterdir():
                data = bytearray(f.read_bytes())
                data[len(data) // 2] ^= 0xFF
                (bad / f.name).write_bytes(bytes(data))
            AgentClient(w.pid).restore(external=True)
            with pytest.raises(NpusnapError):
                simimages.import_device(w.pid, bad, None)
            assert AgentClient(w.pid).status().state == "LOCKED"
        r = npusnap("recover", w.pid, env=env)
        line = assert_failed_cleanly(r, {9, 11})
        assert "--device-images" in line, line
        r = npusnap("recover", w.pid, "--device-images", target / "device", "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "RUNNING"
        assert_running_intact(w, reference, env)
    finally:
        w.stop()


def test_recover_stopped_past_the_lease_before_its_unlock_succeeds(npusim_daemon, reference, tmp_path):
    """`recover` of a process locked on a lease, stopped before its unlock until the lease ran out:
    the agent unlocked it by itself, and recover reports it running (it reported the refused unlock
    as a failure)."""
    from npusnap_cli.platform.agent import AgentClient

    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    cli = None
    try:
        AgentClient(w.pid).lock(30, lease_s=1)
        cli = PausedCli(["recover", w.pid, "--json"], "device-unlock", {**env, "NPUSNAP_TEST_PAUSE_S": "1"})
        r = stopped_past_the_lease(cli, w.pid)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "RUNNING"
        assert_running_intact(w, reference, env)
    finally:
        _reap_cli(cli)
        w.stop()


def test_forking_tree_is_checkpointed_as_criu_froze_it(npusim_daemon, tmp_path):
    """`npusnap run -- bash -c 'while :; do sleep 0.02; done'`: children forked between the
    tree listing and CRIU's freeze are killed with the tree (none is left stopped), the
    manifest holds CRIU's tree, and the checkpoint restores."""
    tag = uuid.uuid4().hex
    env = {**npusim_daemon.env, "NPUSNAP_TEST_TAG": tag}
    target = tmp_path / "ckpts"
    target.mkdir()
    w = Workload([*npusnap_cmd(), "run", "--", "bash", "-c", "echo ready; while :; do sleep 0.02; done"],
                 tmp_path / "fork.out", env=env)
    try:
        w.wait_for_line("ready", timeout=30)
        for attempt in range(3):
            r = npusnap("checkpoint", w.pid, "-D", target / str(attempt), env=env)
            assert r.returncode == 0, r.stderr
            _wait_gone(w.pid)
            time.sleep(0.3)
            left = _tagged(tag)
            assert not left, f"left behind after the checkpoint: {left}"
            manifest = (target / str(attempt) / "manifest.yaml").read_text()
            assert f"pid: {w.pid}" in manifest
            r = npusnap("restore", "-d", target / str(attempt), env=env)
            assert r.returncode == 0, r.stderr
            assert proc_state(w.pid) not in ("T", "t", "gone", "Z")
    finally:
        w.stop()
        _kill_tagged(tag)


CHILD_WITH_DEVICE = r"""
import os, sys, time
import npusim
npusim.init()
npusim.set_device(0)
ptr = npusim.malloc(1 << 20)
child = os.fork()
if child == 0:
    npusim.malloc(1 << 20)  # the child's own device state
    while True:
        time.sleep(0.05)
print("ready pid", os.getpid(), "child", child, flush=True)
while True:
    time.sleep(0.05)
"""


def test_descendant_with_device_state_is_refused_before_locking(npusim_daemon, tmp_path):
    env = npusim_daemon.env
    w = Workload([*npusnap_cmd(), "run", "--", sys.executable, "-c", CHILD_WITH_DEVICE],
                 tmp_path / "child.out", env=env)
    child = 0
    try:
        line = w.wait_for_line("ready pid", timeout=30)[-1]
        child = int(line.split()[-1])
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ckpt", env=env)
        err = assert_failed_cleanly(r, {13})
        assert str(child) in err and "device state" in err, err
        assert_no_valid_checkpoint(tmp_path / "ckpt")
        doc = json.loads(npusnap("status", w.pid, "--json", env=env, check=True).stdout)
        assert doc["state"] == "RUNNING" and not doc["stopped"], doc
    finally:
        w.stop()
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
