"""SIGINT or SIGTERM at a random instant of a process set's live checkpoint (`checkpoint PID PID PID
--live`, direct data path): three examples/train.py runs (npusim devices 0, 1, 0) rewrite their
device memory every few milliseconds, so the daemon's copy-on-write snapshots are busy while the
set's images are written behind. The instants fall anywhere from the CLI's start to its exit: the
locks, the snapshots, the dumps into memory, the set's resume, the write-behind, the seal, the
commit. Every trial ends committed (the checkpoint verifies) or rolled back (no checkpoint, no
partial one), with every member running, unlocked, every step as an uninterrupted run's, nothing
left in the tmpfs staging, no snapshot left in the daemon and no process of ours stopped or stray.

NPUSNAP_FAULT_LIVE_SET trials (8 by default; `make faults` runs more), NPUSNAP_FAULT_SEED to
replay them (the seed is printed)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import npusnap, npusnap_cmd, requires_criu

from .support import (
    DOCUMENTED_CODES,
    Reference,
    assert_no_valid_checkpoint,
    assert_running_intact,
    before_first_instruction,
    one_error_line,
    start_train,
    wait_recovers,
)
from .test_processset_faults import _assert_no_stray, _stop
from .test_random_faults import SEED

pytestmark = [requires_criu, pytest.mark.criu]

TRIALS = int(os.environ.get("NPUSNAP_FAULT_LIVE_SET") or 8)
SIGNALS = [signal.SIGINT, signal.SIGTERM]
DEVICES = (0, 1, 0)


def _snapshots(daemon: NpuSimDaemon) -> int:
    import npusim

    return int(dict(npusim.daemon_status(daemon.socket))["snapshots"])


def _until(what: str, done, bound: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound
    while not done():
        assert time.monotonic() < deadline, f"{what} after {bound} s"
        time.sleep(0.05)


def _signal(cli: subprocess.Popen, sig: signal.Signals, delay: float) -> tuple[bool, bool]:
    """sig after delay: (False, _) when the CLI had finished first, (_, True) when it was sent
    before the launcher's first instruction (nothing of ours ran: support.before_first_instruction)."""
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline:
        if cli.poll() is not None:
            return False, False
        time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
    if cli.poll() is not None:
        return False, False
    early = before_first_instruction(cli.pid)
    cli.send_signal(sig)
    return True, early


def test_a_signal_at_a_random_instant_of_a_live_set_checkpoint(npusim_daemon: NpuSimDaemon, reference: Reference,
                                                                tmp_path: Path, shm: Path) -> None:
    tag = uuid.uuid4().hex
    env = {**npusim_daemon.env, "NPUSNAP_TEST_TAG": tag}
    rng = random.Random(f"{SEED}:live-set")
    print(f"seed {SEED} (NPUSNAP_FAULT_SEED to replay)")
    ws = []
    try:
        for i, device in enumerate(DEVICES):
            ws.append(start_train(tmp_path, env, name=f"m{i}-{uuid.uuid4().hex[:6]}", steps=100000, sleep_ms=5,
                                  scratch_mb=16, device=device))
        pids = [w.pid for w in ws]

        def live(ck: Path) -> list[str]:
            return [*npusnap_cmd(), "checkpoint", *map(str, pids), "-D", str(ck), "--live", "--live-staging",
                    str(shm), "--data-path", "direct", "--json"]

        t0 = time.monotonic()
        timed = subprocess.run(live(tmp_path / "ck-timed"), env=env, capture_output=True, text=True, timeout=180,
                               stdin=subprocess.DEVNULL)
        span = time.monotonic() - t0  # the instants fall anywhere in a whole checkpoint, and a little beyond
        assert timed.returncode == 0, timed.stderr
        doc = json.loads(timed.stdout)
        assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "resume", "write-behind", "seal"]
        print(f"a live set checkpoint: {span * 1000:.0f} ms, the set stopped {doc['downtime_s'] * 1000:.0f} ms")
        outcomes = []
        for i in range(TRIALS):
            ck, err = tmp_path / f"ck{i}", tmp_path / f"ck{i}.err"
            sig = rng.choice(SIGNALS)
            delay = rng.uniform(0, span * 1.2)
            why = f"seed {SEED}, trial {i}: {sig.name} after {delay * 1000:.1f} ms"
            start = time.monotonic()
            with open(err, "w") as e:
                cli = subprocess.Popen(live(ck), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=e,
                                       env=env)
            try:
                landed, early = _signal(cli, sig, delay)
                cli.wait(timeout=180)
            finally:
                if cli.poll() is None:
                    cli.kill()
                cli.wait()
            if not landed:  # the first (timed) checkpoint ran cold: the span follows the later ones
                span = 0.7 * span + 0.3 * (time.monotonic() - start)
            rc, stderr = cli.returncode, err.read_text()
            if rc == -sig and not stderr and (early or sig == signal.SIGTERM):
                # SIGINT inside execve: nothing of ours ran. SIGTERM before the CLI's handlers (the
                # interpreter starting): its default action; the guardian, if started, cleans up.
                outcomes.append("interrupted inside execve" if early else "terminated before its handlers")
                _until(f"{why}: the guardian left {ck}'s staging", lambda ck=ck: not any(
                    p.name.startswith(f".{ck.name}.") for p in tmp_path.iterdir()))
                assert_no_valid_checkpoint(ck, partial_ok=False)
            else:
                assert rc in {0} | DOCUMENTED_CODES and "Traceback" not in stderr, f"{why}: exit {rc}: {stderr}"
                outcomes.append("finished before the signal" if not landed else f"exit {rc}")
                if rc == 0:  # committed (the signal came before the handlers, or after the commit)
                    assert npusnap("verify", ck).returncode == 0, f"{why}: {stderr}"
                else:
                    one_error_line(stderr)
                    assert_no_valid_checkpoint(ck, partial_ok=False)
                    assert not ck.exists(), why
            _until(f"{why}: something left in {shm}", lambda: not any(shm.iterdir()))
            _until(f"{why}: the daemon still holds a snapshot", lambda: _snapshots(npusim_daemon) == 0)
            for w in ws:
                wait_recovers(w, env=env)
                assert_running_intact(w, reference, env)
            _assert_no_stray(tag, set(pids))
        print(f"seed {SEED}: {', '.join(outcomes)}")
    finally:
        _stop(ws)
