"""Stream stop/abort, stream state callbacks, task ids and a failed launch's exception info
(tests/cann/stream_abort.c), on a real daemon with a real kernel that crashes."""

from __future__ import annotations

import subprocess

STREAM_ABORT, AICORE_EXCEPTION = 107023, 507015  # ACL_ERROR_RT_STREAM_ABORT, ACL_ERROR_RT_AICORE_EXCEPTION
INVALID_PARAM = 100000


def test_stop_abort_task_ids_and_exception_info(npusim_daemon, cann_program, kernels_so) -> None:
    exe = cann_program("stream_abort.c", "-lascendcl")
    r = subprocess.run([str(exe), str(kernels_so)], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "stop sync 0 memset 00 event 0",  # dropped, not run; the dropped record completes the event
        f"abort sync {STREAM_ABORT} then 0 memset 33",
        f"null stream {INVALID_PARAM} {INVALID_PARAM}",
        f"task ids next 1 null {INVALID_PARAM}",
        f"crash sync {AICORE_EXCEPTION} task 1 func 0 1 args 0 8 npusim!",
        f"null info {INVALID_PARAM} {INVALID_PARAM}",
        f"states 3: 1 1 1 1 {INVALID_PARAM}",
        "done",
    ]

