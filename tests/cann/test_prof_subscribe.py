"""Model subscriptions (tests/cann/prof_subscribe.c): aclprofModelSubscribe on a model run
instance's id delivers one op record per task of each run through the pipe, stamped by the stream;
unsubscribing closes the pipe's write end; CANN's codes for unknown and repeated subscriptions."""

from __future__ import annotations

import subprocess


def test_subscription_delivers_the_ops_of_each_run(npusim_daemon, build_c) -> None:
    runs = 3
    r = subprocess.run([str(build_c("prof_subscribe")), str(runs)], env=npusim_daemon.env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    # Unknown model id and unsubscribing what is not subscribed: ACL_ERROR_INVALID_MODEL_ID (100011);
    # MsprofSetDeviceIdByGeModelIdx registers an id; a second subscription: ACL_ERROR_PROF_REPEAT_SUBSCRIBE.
    assert lines[0] == "errors unknown 100011 unsub 100011 register 0"
    assert lines[1] == "errors repeat 148046"
    assert lines[2] == "closed 0"  # the registered id's pipe ended at its unsubscribe
    ops = [line for line in lines if line.startswith("op ")]
    # Model id 1 (the first model run instance), memset then copy, start <= end and duration = end - start.
    assert ops == ["op 1 MEMSET memset 1 flag 0", "op 1 MEMCPY memcpy 1 flag 0"] * runs
    assert lines[-2:] == [f"ops {2 * runs} data 7", "done"]
