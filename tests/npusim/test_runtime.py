"""The npusim runtime through its Python bindings: isolation, the snapshot state machine, the
lock gate, and device state surviving backup + daemon restart + restore. Each workload runs in
its own process, as one client of a private daemon."""

from __future__ import annotations

import json
import time

import npusim
import pytest
from npusim_helpers import reap, run_py, spawn_py

LOCK_TIMEOUT = 507905
LOCK_FAILED = 507906
UNLOCK_FAILED = 507907
BACKUP_FAILED = 507908
RESTORE_FAILED = 507909
INVALID_PARAM = 100000

PRELUDE = """
import json, os, sys, threading, time
import numpy as np
import npusim

def code(f, *args):
    try:
        f(*args)
    except npusim.AclError as e:
        return e.code
    return 0
"""


def test_two_clients_are_isolated(npusim_daemon) -> None:
    owner = spawn_py(PRELUDE + """
npusim.init(); npusim.set_device(0)
p = npusim.malloc(4096)
npusim.memcpy_h2d(p, np.full(1024, 1.5, np.float32))
print(p)
sys.stdin.readline()
out = np.zeros(1024, np.float32); npusim.memcpy_d2h(out, p)
print(out.min(), out.max())
""", npusim_daemon.env)
    try:
        theirs = int(owner.stdout.readline())
        out = run_py(PRELUDE + f"""
theirs = {theirs}
npusim.init(); npusim.set_device(0)
mine = npusim.malloc(4096)
assert (mine >> 40) & 0xfff != (theirs >> 40) & 0xfff, "each client has its own VA window"
buf = np.zeros(1024, np.float32)
assert code(npusim.memcpy_d2h, buf, theirs) == {INVALID_PARAM}
assert code(npusim.memcpy_h2d, theirs, buf) == {INVALID_PARAM}
assert code(npusim.free, theirs) == {INVALID_PARAM}
npusim.memset(mine, 0, 4096)
print("isolated")
""", npusim_daemon.env)
        assert out == "isolated\n"
        # The second client's session ends when the daemon sees its connections close.
        deadline = time.monotonic() + 10
        while len(status := npusim.daemon_status(npusim_daemon.socket)["clients"]) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        status = npusim.daemon_status(npusim_daemon.socket)
        assert [c["pid"] for c in status["clients"]] == [owner.pid]
        assert status["clients"][0]["bytes"] == 4096
        assert status["devices"][0]["used"] == 4096
        owner.stdin.write("\n")
        owner.stdin.flush()
        assert owner.stdout.readline().split() == ["1.5", "1.5"]
        assert owner.wait(timeout=10) == 0
    finally:
        reap(owner)
    assert npusim.daemon_status(npusim_daemon.socket)["clients"] == []


def test_copies_to_the_host_are_exact_at_any_alignment(npusim_daemon) -> None:
    """A device->host copy whose destination is not at the source's cache-line offset goes
    through the daemon's staging buffer in pieces, split across threads when large: every byte
    lands where it belongs, and none beside the destination is touched."""
    out = run_py(PRELUDE + """
npusim.init(); npusim.set_device(0)
MiB = 1 << 20
total = 9 * MiB + 77
pattern = (np.arange(total + 64, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
dev = npusim.malloc(total + 64)
npusim.memcpy_h2d(dev, pattern)
checked = 0
for src_off in (0, 16):
    for shift in (0, 1, 16, 48, 63):
        for size in (4095, 2 * MiB, 5 * MiB + 77, total):
            raw = np.full(size + 128, 0xEE, np.uint8)
            dst = raw[shift:shift + size]
            npusim.memcpy_d2h(dst, dev + src_off)
            assert np.array_equal(dst, pattern[src_off:src_off + size]), (src_off, shift, size)
            assert (raw[:shift] == 0xEE).all() and (raw[shift + size:] == 0xEE).all(), (src_off, shift, size)
            checked += 1
npusim.free(dev)
print(checked)
""", npusim_daemon.env)
    assert out == "40\n"


def test_lock_waits_for_queued_work(npusim_daemon) -> None:
    # The stream is FIFO: its last task (a fill of d) finishes only after every matmul before it,
    # so a Lock that returned early would leave d (or c) unfinished.
    out = run_py(PRELUDE + """
n = 320
npusim.init(); npusim.set_device(0)
a, b, c, d = (npusim.malloc(n * n * 4) for _ in range(4))
s = npusim.create_stream()
npusim.launch_fill(a, n * n, 1.0, s); npusim.launch_fill(b, n * n, 2.0, s)
npusim.synchronize_stream(s)
npusim.memset(c, 0, n * n * 4); npusim.memset(d, 0, n * n * 4)
for _ in range(6):
    npusim.launch_matmul(n, n, n, a, b, c, s)
npusim.launch_fill(d, n * n, 7.0, s)
npusim.snapshot_lock()
assert npusim.snapshot_info()["state"] == "LOCKED"
out = np.empty(n * n, np.float32)
npusim.memcpy_d2h(out, d)  # the locking thread keeps its access
assert (out == 7.0).all(), "lock returned before the queued work finished"
npusim.memcpy_d2h(out, c)
assert (out == 2.0 * n).all(), "lock returned before the queued work finished"
npusim.snapshot_unlock()
print("ok")
""", npusim_daemon.env)
    assert out == "ok\n"


def test_lock_times_out_on_work_that_never_finishes(npusim_daemon) -> None:
    env = {**npusim_daemon.env, "NPUSIM_LOCK_TIMEOUT_MS": "300"}
    out = run_py(PRELUDE + f"""
npusim.init(); npusim.set_device(0)
p = npusim.malloc(64)
s = npusim.create_stream(); e = npusim.create_event()
npusim.stream_wait_event(s, e)     # never recorded: s is stuck
npusim.launch_fill(p, 16, 4.0, s)
t = time.perf_counter()
assert code(npusim.snapshot_lock) == {LOCK_TIMEOUT}
assert 0.25 < time.perf_counter() - t < 5
assert npusim.snapshot_info()["state"] == "RUNNING"
npusim.record_event(e, 0)          # the process is untouched: unblock the stream and carry on
npusim.synchronize_stream(s)
out = np.zeros(16, np.float32); npusim.memcpy_d2h(out, p)
assert (out == 4.0).all()
npusim.snapshot_lock(); npusim.snapshot_unlock()
print("ok")
""", env)
    assert out == "ok\n"


def test_other_threads_block_while_locked(npusim_daemon) -> None:
    out = run_py(PRELUDE + """
npusim.init(); npusim.set_device(0)
p = npusim.malloc(64)
done = threading.Event()
def worker():
    q = npusim.malloc(64)
    npusim.memcpy_h2d(q, np.ones(16, np.float32))
    done.set()
npusim.snapshot_lock()
th = threading.Thread(target=worker); th.start()
assert not done.wait(0.5), "a device call ran while the process was locked"
npusim.memset(p, 1, 64)            # the locking thread is not blocked
npusim.snapshot_backup()
assert not done.wait(0.2)
npusim.snapshot_restore()
assert not done.wait(0.2)
npusim.snapshot_unlock()
assert done.wait(10), "the blocked call did not proceed after unlock"
th.join()
print("ok")
""", npusim_daemon.env)
    assert out == "ok\n"


def test_state_machine_misuse_returns_cann_codes(npusim_daemon) -> None:
    out = run_py(PRELUDE + f"""
pid = os.getpid()
npusim.init(); npusim.set_device(0)
p = npusim.malloc(1 << 16)
data = np.random.default_rng(1).integers(0, 255, 1 << 16, dtype=np.uint8)
npusim.memcpy_h2d(p, data)
assert code(npusim.snapshot_backup) == {BACKUP_FAILED}      # RUNNING
assert code(npusim.snapshot_restore) == {RESTORE_FAILED}
assert code(npusim.snapshot_unlock) == {UNLOCK_FAILED}
assert code(npusim.snapshot_lock, pid + 1) == {INVALID_PARAM}
assert code(npusim.snapshot_lock, None, 8) == {INVALID_PARAM}
assert code(npusim.snapshot_backup, pid + 1) == {INVALID_PARAM}
npusim.snapshot_lock()
assert code(npusim.snapshot_lock) == {LOCK_FAILED}
assert code(npusim.snapshot_restore) == {RESTORE_FAILED}    # LOCKED, nothing backed up
npusim.snapshot_backup()
assert npusim.snapshot_info()["state"] == "BACKED_UP"
assert code(npusim.snapshot_backup) == {BACKUP_FAILED}      # BACKED_UP
assert code(npusim.snapshot_lock) == {LOCK_FAILED}
assert code(npusim.snapshot_unlock, pid + 1) == {INVALID_PARAM}
assert code(npusim.snapshot_restore, pid + 1) == {INVALID_PARAM}
npusim.snapshot_restore()
assert npusim.snapshot_info()["state"] == "LOCKED"
npusim.snapshot_backup()                                    # repeatable after a restore
npusim.snapshot_unlock()                                    # from BACKED_UP: the device comes back
info = npusim.snapshot_info()
assert info["state"] == "RUNNING" and info["connected"], info
out = np.zeros_like(data); npusim.memcpy_d2h(out, p)
assert (out == data).all()
print("ok")
""", npusim_daemon.env)
    assert out == "ok\n"


WORKLOAD = PRELUDE + """
rng = np.random.default_rng(7)
npusim.init()
npusim.set_device(1)
p1 = npusim.malloc(1 << 20)
d1 = rng.integers(0, 255, 1 << 20, dtype=np.uint8)
npusim.memcpy_h2d(p1, d1)
npusim.set_device(0)
npusim.device_enable_peer_access(1)
p0 = npusim.malloc((5 << 20) + 3)
d0 = rng.integers(0, 255, (5 << 20) + 3, dtype=np.uint8)
npusim.memcpy_h2d(p0, d0)
w = npusim.malloc(4096 * 4)
npusim.launch_fill(w, 4096, 0.25)
npusim.synchronize_device()  # the default stream: not ordered with s (the axpy below must see the fill)
s = npusim.create_stream()
e0, e1 = npusim.create_event(), npusim.create_event()
npusim.record_event(e0, s); npusim.launch_axpy(4096, 2.0, w, w, s); npusim.record_event(e1, s)
npusim.synchronize_event(e1)
elapsed = npusim.event_elapsed_time(e0, e1)
print(json.dumps({"p0": p0, "p1": p1, "w": w, "s": s, "e": e1}))

def restored_ok():
    b0 = np.zeros_like(d0); npusim.memcpy_d2h(b0, p0)
    b1 = np.zeros_like(d1); npusim.memcpy_d2h(b1, p1)
    bw = np.zeros(4096, np.float32); npusim.memcpy_d2h(bw, w)
    assert (b0 == d0).all() and (b1 == d1).all() and (bw == 0.75).all(), "device data changed"
    npusim.synchronize_event(e1)                          # a recorded event stays recorded
    assert npusim.event_elapsed_time(e0, e1) == elapsed
    npusim.launch_axpy(4096, 1.0, w, w, s)               # the same stream handle still works
    npusim.synchronize_stream(s)
    npusim.memcpy_d2h(bw, w); assert (bw == 1.5).all()
    npusim.memcpy_d2d(p1, p0, 1 << 20)                    # peer access stays enabled
    npusim.memcpy_d2h(b1, p1); assert (b1 == d0[: 1 << 20]).all()
    return True
"""


def test_device_state_survives_backup_daemon_restart_restore(npusim_daemon) -> None:
    proc = spawn_py(WORKLOAD + f"""
npusim.snapshot_lock(); npusim.snapshot_backup()
info = npusim.snapshot_info()
assert info["state"] == "BACKED_UP" and not info["connected"], info
print("backed-up")
sys.stdin.readline()                                      # the daemon is gone now
assert code(npusim.snapshot_restore) == {RESTORE_FAILED}
assert npusim.snapshot_info()["state"] == "BACKED_UP"
print("restore-failed")
sys.stdin.readline()                                      # a new daemon runs now
npusim.snapshot_restore(); npusim.snapshot_unlock()
assert restored_ok()
print("restored", json.dumps(npusim.snapshot_info()))
""", npusim_daemon.env)
    try:
        handles = json.loads(proc.stdout.readline())
        assert proc.stdout.readline() == "backed-up\n"
        # Backup released the device; the daemon notices the closed connections within moments.
        deadline = time.monotonic() + 5
        while True:
            status = npusim.daemon_status(npusim_daemon.socket)
            if status["clients"] == [] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert status["clients"] == [] and all(d["used"] == 0 for d in status["devices"])
        old_pid = status["pid"]
        npusim_daemon.stop()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "restore-failed\n"
        npusim_daemon.start()
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith("restored "), line + proc.stderr.read()
        info = json.loads(line.split(" ", 1)[1])
        live = {kind: n for kind, n in info.pop("resources").items() if n}  # the kinds this program uses
        assert live == {"memory": 3, "contexts": 2, "streams": 3, "events": 2}
        assert info == {"state": "RUNNING", "devices": [0, 1], "allocations": 3,
                        "bytes": ((5 << 20) + 32) + (1 << 20) + 4096 * 4, "streams": 3,
                        "events": 2, "connected": True, "direct": True, "data_path": "in-process",
                        "communicators": []}
        status = npusim.daemon_status(npusim_daemon.socket)
        assert status["pid"] != old_pid
        assert [c["pid"] for c in status["clients"]] == [proc.pid]
        assert status["clients"][0]["bytes"] == info["bytes"]
        assert handles["p0"] >> 52 == (1 << 8) | 0 and handles["p1"] >> 52 == (1 << 8) | 1
        assert proc.wait(timeout=10) == 0
    finally:
        reap(proc)


def test_daemon_admin_status_and_shutdown(npusim_daemon) -> None:
    status = npusim.daemon_status(npusim_daemon.socket)
    assert status["pid"] == npusim_daemon.proc.pid
    assert [d["total"] for d in status["devices"]] == [1 << 30, 1 << 30]
    npusim.daemon_shutdown(npusim_daemon.socket)
    assert npusim_daemon.proc.wait(timeout=10) == 0
    with pytest.raises(npusim.AclError):
        npusim.daemon_status(npusim_daemon.socket)
