"""Stream activation in a model run instance (tests/cann/stream_switch.c): only the head stream
starts; aclrtSwitchStream activates its stream when the condition on device values holds (7 > 5:
s3; 3 <= 5: s4, which activates s2); activating a stream not bound to a model is refused."""

from __future__ import annotations

import subprocess


def test_streams_run_when_activated(npusim_daemon, build_c) -> None:
    r = subprocess.run([str(build_c("stream_switch"))], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "errors unbound 107005 cond 100000",  # ACL_ERROR_RT_STREAM_MODEL; an unknown condition
        "run 7: 11 33 00 00",
        "run 3: 11 00 44 22",
        "run 5: 11 00 44 22",
        "run 6: 11 33 00 00",
        "done",
    ]
