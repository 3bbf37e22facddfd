"""A signal at a random moment of a live checkpoint's write-behind (`checkpoint --live`): the
workload (examples/train.py, rewriting 64 MiB of device memory every few milliseconds, so the
daemon's copy-on-write snapshot is busy copying aside while the images are written) runs on
throughout. SIGINT, SIGTERM or SIGKILL lands anywhere from the resume to the commit; every trial
ends in a checkpoint that verifies, or in no checkpoint at all, nothing left in the tmpfs staging
and no snapshot left in the daemon, with the workload running, unlocked, every step as an
uninterrupted run's.

NPUSNAP_FAULT_LIVE trials (6 by default), NPUSNAP_FAULT_SEED to replay them (the seed is printed)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import npusnap, npusnap_cmd, requires_criu

from .support import Reference, assert_running_intact, one_error_line, start_train, with_suppress_kill

pytestmark = [requires_criu, pytest.mark.criu]

SEED = int(os.environ.get("NPUSNAP_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
TRIALS = int(os.environ.get("NPUSNAP_FAULT_LIVE") or 6)
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]


def _snapshots(daemon: NpuSimDaemon) -> int:
    import npusim

    return int(dict(npusim.daemon_status(daemon.socket))["snapshots"])


def _until(what: str, done, bound: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound
    while not done():
        assert time.monotonic() < deadline, f"{what} after {bound} s"
        time.sleep(0.05)


def test_a_signal_at_a_random_moment_of_the_write_behind(npusim_daemon: NpuSimDaemon, reference: Reference,
                                                         tmp_path: Path, shm: Path) -> None:
    env = npusim_daemon.env
    w = start_train(tmp_path, env, steps=100000, sleep_ms=5, scratch_mb=64)
    rng = random.Random(SEED)
    print(f"seed {SEED} (NPUSNAP_FAULT_SEED to replay)")
    try:
        def live(ck: Path, *extra: str) -> list[str]:
            return [*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(ck), "--live", "--live-staging", str(shm),
                    "--data-path", "direct", "--json", *extra]

        timed = subprocess.run(live(tmp_path / "ck-timed"), env=env, capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL)
        assert timed.returncode == 0, timed.stderr
        phases = {p["name"]: p for p in json.loads(timed.stdout)["phases"]}
        span = phases["write-behind"]["seconds"] + phases["seal"]["seconds"]  # the signals fall in it, and beyond
        copied = phases["write-behind"]["parts"]["copied-aside"]["bytes"]
        print(f"write-behind and seal {span * 1000:.0f} ms, {copied >> 20} MiB copied aside meanwhile")
        outcomes = []
        for i in range(TRIALS):
            ck, go, err = tmp_path / f"ck{i}", tmp_path / f"go{i}", tmp_path / f"ck{i}.err"
            sig = rng.choice(SIGNALS)
            delay = rng.uniform(0, span * 2)
            why = f"seed {SEED}, trial {i}: {sig.name} {delay * 1000:.1f} ms into the write-behind"
            with open(err, "w") as e:
                cli = subprocess.Popen(live(ck), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=e,
                                       env={**env, "NPUSNAP_TEST_PAUSE": "before:write-behind",
                                            "NPUSNAP_TEST_PAUSE_UNTIL": str(go), "NPUSNAP_TEST_PAUSE_S": "120"})
            try:
                _until(f"{why}: no pause", lambda err=err, cli=cli: "test pause before:write-behind" in err.read_text()
                       or cli.poll() is not None)
                assert cli.poll() is None, f"{why}: {err.read_text()}"
                go.touch()
                time.sleep(delay)
                with_suppress_kill(cli.pid, sig)
                cli.wait(timeout=120)
            finally:
                if cli.poll() is None:
                    cli.kill()
                cli.wait()
            outcomes.append(cli.returncode)
            stderr = err.read_text()
            if cli.returncode == 0:  # the signal came after the commit
                assert npusnap("verify", ck).returncode == 0, f"{why}: {stderr}"
            else:
                if sig != signal.SIGKILL:
                    one_error_line(stderr)
                    assert "Traceback" not in stderr, why
                _until(f"{why}: the guardian left {ck}'s staging", lambda ck=ck: not any(
                    p.name.startswith(f".{ck.name}.") for p in tmp_path.iterdir()))
                assert not ck.exists(), why
            _until(f"{why}: something left in {shm}", lambda: not any(shm.iterdir()))
            _until(f"{why}: the daemon still holds a snapshot", lambda: _snapshots(npusim_daemon) == 0)
            assert_running_intact(w, reference, env)
        print(f"seed {SEED}: exits {outcomes}")
    finally:
        w.stop()
