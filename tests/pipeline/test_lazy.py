"""`npusnap restore --lazy`, end to end on a real daemon with real CRIU (lazy-pages over
userfaultfd): the workload runs before its memory is back and comes out bit-exact (host and
device); a flipped byte in a device chunk fails the workload's first access to it with
ACL_ERROR_RT_DEVICE_MEM_ERROR and the restore exits 8; the page server and the daemon's fill
end with the workload (exited or killed), and an interrupt at random instants of a lazy restore
leaves either a running restore or nothing at all, the checkpoint still restorable."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import Workload, npusnap, npusnap_cmd, pid_alive, requires_criu, rewind_to_checkpoint

from .support import interrupt, strip_ready, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "npusim_lazy.py"
STEPS = 6
ACL_ERROR_RT_DEVICE_MEM_ERROR = 507053
SIGINT_TRIALS = int(os.environ.get("NPUSNAP_LAZY_SIGINT", "3"))


def _argv(gate: str) -> list[str]:
    return [sys.executable, str(WORKLOAD), str(STEPS), gate]


def _lazy_servers(ck: Path) -> list[int]:
    """`criu lazy-pages` processes serving this checkpoint's restores (they run in its logs/)."""
    logs = str((ck / "logs").resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd").startswith(logs):
                found.append(int(entry))
        except OSError:
            continue
    return found


class Lazy:
    """The workload, checkpointed once (killed) with the direct data path, gated step by step."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.gate = tmp / "gate"
        self.gate.mkdir()
        self.w = Workload(under_agent(_argv(str(self.gate))), tmp / "lazy.out", env=env)
        self.w.wait_for_line("ready pid", timeout=60)
        self.ck = tmp / "ck"
        r = npusnap("checkpoint", self.w.pid, "-D", self.ck, "--data-path", "direct", env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        self.w.wait_exit(timeout=30)
        self.w.proc.wait(timeout=10)  # reaped: a zombie would hold the pid the restore needs

    def open_gates(self) -> None:
        for k in range(STEPS):
            (self.gate / f"go-{k}").touch()

    def restore(self, *extra: str, timeout: float = 120) -> "subprocess.CompletedProcess[str]":
        rewind_to_checkpoint(self.ck, self.w.out)
        return npusnap("restore", self.ck, "--lazy", *extra, env=self.env, timeout=timeout)

    def popen(self, *extra: str) -> "subprocess.Popen[str]":
        rewind_to_checkpoint(self.ck, self.w.out)
        return subprocess.Popen([*npusnap_cmd(), "restore", str(self.ck), "--lazy", *extra],
                                env={**self.env, "PYTHONFAULTHANDLER": "1"},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def flip_device_byte(self) -> None:
        """One byte in the last data chunk of dev0.img (the last chunk of the last allocation,
        which step 2 reads first)."""
        img = self.ck / "device" / "dev0.img"
        data = img.read_bytes()
        index_offset = int.from_bytes(data[-80:][40:48], "little")  # Footer.index_offset
        at = index_offset - 1000
        with open(img, "r+b") as f:
            f.seek(at)
            f.write(bytes([data[at] ^ 0x5A]))


@pytest.fixture
def lazy(npusim_daemon, tmp_path):  # type: ignore[no-untyped-def]
    c = Lazy(tmp_path, npusim_daemon.env)
    try:
        yield c
    finally:
        c.w.stop()
        for pid in _lazy_servers(c.ck):
            os.kill(pid, signal.SIGKILL)


def test_lazy_restore_is_bit_exact(lazy, reference) -> None:  # type: ignore[no-untyped-def]
    ref = reference(_argv("-"))
    # --detach returns once all memory is in; the gated workload has touched nothing meanwhile.
    r = lazy.restore("--detach", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["lazy"]["device"]["state"] == "done", doc["lazy"]
    assert doc["lazy"]["device"]["bad"] == 0 and doc["lazy"]["device"]["ready"] == doc["lazy"]["device"]["chunks"]
    assert doc["lazy"]["pages_status"] == 0 and not doc["lazy"]["problems"]
    assert _lazy_servers(lazy.ck) == []  # the page server ended, reaped
    lazy.open_gates()
    lazy.w.pid = doc["pid"]
    lazy.w.wait_exit(timeout=60)
    assert strip_ready(lazy.w.lines()) == ref

    # In the foreground with the gates open: the workload reads its memory while it comes in.
    r = lazy.restore()
    assert r.returncode == 0, r.stderr
    assert "all memory of process" in r.stderr or "exited before all its memory" in r.stderr, r.stderr
    assert strip_ready(lazy.w.lines()) == ref
    assert _lazy_servers(lazy.ck) == []


def test_flipped_device_byte_fails_the_first_touch(lazy) -> None:  # type: ignore[no-untyped-def]
    lazy.flip_device_byte()
    lazy.open_gates()
    r = lazy.restore()
    assert r.returncode == 8, (r.returncode, r.stderr)
    assert "checksum mismatch in chunk" in r.stderr and "dev0.img" in r.stderr, r.stderr
    lines = lazy.w.lines()
    assert lines[-1] == f"acl error {ACL_ERROR_RT_DEVICE_MEM_ERROR}", (lines[-3:], r.stderr)
    # Steps 0 and 1 read good chunks; step 2 the damaged one: its bytes never reached the workload.
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["0", "1"], lines
    assert _lazy_servers(lazy.ck) == []
    # The damage is the image's: a full restore refuses it too (the daemon checks every chunk).
    rewind_to_checkpoint(lazy.ck, lazy.w.out)
    full = npusnap("restore", lazy.ck, env=lazy.env, timeout=120)
    assert full.returncode == 8, full.stderr


def test_lazy_servers_end_with_a_killed_workload(lazy) -> None:  # type: ignore[no-untyped-def]
    cli = lazy.popen()  # gates closed: the workload waits at step 0 while its memory comes in
    pid = int(yaml.safe_load((lazy.ck / "manifest.yaml").read_text())["pid"])
    try:
        assert cli.stderr is not None
        first = cli.stderr.readline()  # the restore committed: the workload runs
        assert "its memory comes in lazily" in first, first + cli.stderr.read()
        os.kill(pid, signal.SIGKILL)
        code = cli.wait(timeout=120)
        err = first + cli.stderr.read()
        assert code == 128 + signal.SIGKILL, (code, err)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert _lazy_servers(lazy.ck) == []
    assert _daemon_lazy_state(lazy.env, pid) in ("done", "cancelled"), err


def test_sigint_at_random_instants_of_a_lazy_restore(lazy, reference) -> None:  # type: ignore[no-untyped-def]
    ref = reference(_argv("-"))
    seed = int(os.environ.get("NPUSNAP_FAULT_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    pid = int(yaml.safe_load((lazy.ck / "manifest.yaml").read_text())["pid"])
    for trial in range(SIGINT_TRIALS):
        cli = lazy.popen()
        err = interrupt(cli, rng.uniform(0.0, 2.0), again_after=30)  # the gated workload runs on after a second
        code = cli.returncode
        assert code in (0, 130), (seed, trial, code, err)
        # Interrupted before the restore committed: nothing runs; after: the restore stands.
        if pid_alive(pid):
            assert "all memory of process" in err, (seed, trial, err)
            os.kill(pid, signal.SIGKILL)
            lazy.w.pid = pid
            lazy.w.wait_exit(timeout=30)
        assert _lazy_servers(lazy.ck) == [], (seed, trial)
    lazy.open_gates()
    r = lazy.restore()
    assert r.returncode == 0, (seed, r.stderr)
    assert strip_ready(lazy.w.lines()) == ref


def _daemon_lazy_state(env: dict[str, str], pid: int) -> str:
    code = f"import npusim, os; print(npusim.lazy_status(os.environ['NPUSIM_SOCKET'], {pid})['state'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_killed_page_server_fails_the_restore_clearly(lazy) -> None:  # type: ignore[no-untyped-def]
    """The page server killed as soon as it is seen: the restore fails in one clear line (before
    its commit: CRIU's restore could not reach it; after: the workload is killed, since it would
    read zeros where its pages never came), or, if every page was in by then, the workload ends
    as ever. Either way the checkpoint stays valid."""
    cli = lazy.popen()
    killed = []
    try:
        deadline = time.monotonic() + 30
        while not killed and cli.poll() is None and time.monotonic() < deadline:
            for server in _lazy_servers(lazy.ck):
                os.kill(server, signal.SIGKILL)
                killed.append(server)
        lazy.open_gates()  # a workload whose memory was all in runs to its end
        code = cli.wait(timeout=120)
        assert cli.stderr is not None
        err = cli.stderr.read()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert killed, "the page server was never seen"
    assert "Traceback" not in err, err
    if code != 0:
        assert err.count("npusnap: error:") == 1, err
        assert "lazy-pages" in err or "page server" in err or "CRIU" in err, err
    assert npusnap("verify", lazy.ck, env=lazy.env).returncode == 0
