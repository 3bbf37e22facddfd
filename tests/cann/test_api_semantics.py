"""CANN semantics of the value write/wait tasks and the virtual memory / notify API's misuse
codes, from sample-style C programs on a real daemon (no checkpoint)."""

from __future__ import annotations

import subprocess

VALUE_SYNC = """\
eq: waited for 100, saw 100
geq: waited for 5, saw 7
and: waited for 16, saw 48
nor: waited for 240, saw 15
met already: ok
mapped: waited for 42, saw 42
write flag 1: 100000
wait flag 4: 100000
host address: 100000
null: 100000
done
"""

# 100000 ACL_ERROR_INVALID_PARAM, 100001 ACL_ERROR_UNINITIALIZE, 107001 ACL_ERROR_RT_INVALID_DEVICEID.
VMM_ERRORS = """\
malloc physical before init: 100001
granularity: 2097152
granularity bad option: 100000
physical unaligned size: 100000
physical flags: 100000
physical bad device: 107001
reserve with expectPtr: 100000
reserve unaligned size: 100000
reserve bad alignment: 100000
map outside a reservation: 100000
map past the physical end: 100000
map over a mapping: 100000
free a mapped address: 100000
free physical while mapped: 100000
release while mapped: 100000
unmap not a mapping: 100000
set access on the host: 100000
set access past the mapping: 100000
access after set: 1
export V2 bad type: 100000
export twice: 100000
fabric round trip: same memory
import V2 junk: 100000
unmap twice: 100000
release twice: 100000
free physical twice: 100000
notify bad flag: 100000
notify key too short: 100000
notify pids before export: 100000
import a bogus key: 100000
ipc import a bogus key: 100000
ipc close unknown: 100000
notify destroy twice: 100000
done
"""


def _run(exe, env) -> str:
    r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def test_value_write_and_wait_order_two_streams(npusim_daemon, build_c) -> None:
    assert _run(build_c("value_sync"), npusim_daemon.env) == VALUE_SYNC


def test_vmm_and_notify_misuse_gets_cann_codes(npusim_daemon, build_c) -> None:
    assert _run(build_c("vmm_errors"), npusim_daemon.env) == VMM_ERRORS
