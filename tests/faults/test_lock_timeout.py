"""Device work that never finishes: a stream waits on an event nobody records, with a
kernel queued behind it. `checkpoint --lock-timeout 1` must give up with exit 10 and
leave the workload unlocked: its other streams keep working."""

from __future__ import annotations

import sys
import time

import pytest

from tests.helpers import Workload, npusnap, npusnap_cmd

from .support import assert_failed_cleanly, assert_no_valid_checkpoint, proc_state, status

HANG = r"""
import os, time
import numpy as np
import npusim

npusim.init()
npusim.set_device(0)
stuck, live = npusim.create_stream(), npusim.create_stream()
n = 1 << 14
a, b = npusim.malloc(n * 4), npusim.malloc(n * 4)
never = npusim.create_event()
npusim.stream_wait_event(stuck, never)  # never recorded
npusim.launch_fill(a, n, 7.0, stuck)    # queued behind it forever
print("ready pid", os.getpid(), flush=True)
host = np.empty(n, dtype=np.float32)
i = 0
while True:
    npusim.launch_fill(b, n, float(i), live)
    npusim.memcpy_d2h(host, b, live)
    npusim.synchronize_stream(live)
    print(f"tick {i} {'ok' if (host == i).all() else 'BAD'}", flush=True)
    i += 1
    time.sleep(0.02)
"""


def ticks(w: Workload) -> list[str]:
    return [x for x in w.lines() if x.startswith("tick ")]


@pytest.mark.parametrize("runtime_lock_ms", [
    None,  # the agent bounds the runtime's own wait by --lock-timeout
    "3000",  # with the runtime's own wait shortened, the workload does come back by itself
], ids=["runtime-default", "runtime-3s"])
def test_lock_timeout_leaves_workload_unlocked(runtime_lock_ms, npusim_daemon, tmp_path):
    env = dict(npusim_daemon.env)
    if runtime_lock_ms:
        env["NPUSIM_LOCK_TIMEOUT_MS"] = runtime_lock_ms
    w = Workload([*npusnap_cmd(), "run", "--", sys.executable, "-c", HANG], tmp_path / "hang.out", env=env)
    target = tmp_path / "ckpt"
    try:
        w.wait_for_line("tick 3", timeout=30)
        t0 = time.monotonic()
        r = npusnap("checkpoint", w.pid, "-D", target, "--lock-timeout", "1", env=env, timeout=60)
        assert time.monotonic() - t0 < 45  # not the runtime's own 60 s (a loaded host's start-up aside)
        assert_failed_cleanly(r, {10})
        assert_no_valid_checkpoint(target)
        assert proc_state(w.pid) not in ("T", "t", "gone", "Z")
        deadline = time.monotonic() + 15
        while status(w.pid, env)["state"] != "RUNNING":
            assert time.monotonic() < deadline, "still locked after the lock timed out"
            time.sleep(0.1)
        n = len(ticks(w))
        w.wait_for_line(f"tick {n + 5}", timeout=60)  # the live stream keeps working
        assert all(x.endswith(" ok") for x in ticks(w)), ticks(w)[-5:]
    finally:
        w.stop()
