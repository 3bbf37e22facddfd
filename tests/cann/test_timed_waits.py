"""Timed waits (tests/cann/timed_waits.c): aclrtSynchronize{Stream,Event,Device}WithTimeout give
up with CANN's timeout codes while a stream is held, and succeed once it is let go;
aclrtStreamWaitEventWithTimeout fails the stream (reported by its next synchronize) when the
event is not recorded in time, and the stream runs on."""

from __future__ import annotations

import subprocess

STREAM_TIMEOUT, EVENT_TIMEOUT = 507046, 507047  # ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_ERROR_RT_EVENT_SYNC_TIMEOUT


def test_timed_waits(npusim_daemon, build_c) -> None:
    r = subprocess.run([str(build_c("timed_waits"))], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        f"busy stream {STREAM_TIMEOUT} {STREAM_TIMEOUT} event {EVENT_TIMEOUT} device {STREAM_TIMEOUT}",
        # timeout < -1: ACL_ERROR_INVALID_PARAM; a stream's wait takes >= 0: ACL_ERROR_RT_PARAM_INVALID
        "bad timeout 100000 100000 100000 107000",
        "released stream 0 event 0 device 0",
        "memset ran 5a",  # the work queued behind the timed-out synchronizes ran
        f"timed wait {STREAM_TIMEOUT} then 0 memset 77",
        "met wait 0",
        "done",
    ]
