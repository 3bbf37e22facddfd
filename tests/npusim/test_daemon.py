"""npusimd's command-line contract: readiness line, one daemon per socket, stale sockets, SIGTERM."""

from __future__ import annotations

import os
import socket
import subprocess

import npusim
from npusim_helpers import run_py


def test_refuses_a_second_daemon_on_the_same_socket(npusim_daemon) -> None:
    res = subprocess.run([str(npusim_daemon.npusimd), "--socket", npusim_daemon.socket,
                          "--devices", "1", "--memory", "1M", "--foreground"],
                         capture_output=True, text=True, timeout=10)
    assert res.returncode == 3
    assert res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and npusim_daemon.socket in res.stderr
    assert npusim.daemon_status(npusim_daemon.socket)["pid"] == npusim_daemon.proc.pid


def test_replaces_a_stale_socket_and_unlinks_on_sigterm(npusim_daemon) -> None:
    npusim_daemon.stop()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(npusim_daemon.socket)  # a socket file nobody listens on
    stale.close()
    npusim_daemon.start()
    assert npusim.daemon_status(npusim_daemon.socket)["pid"] == npusim_daemon.proc.pid
    npusim_daemon.stop()
    assert not os.path.exists(npusim_daemon.socket)


def test_device_memory_is_limited_per_device(npusim_daemon) -> None:
    npusim_daemon.stop()
    npusim_daemon.devices, npusim_daemon.memory = 3, 1 << 20
    npusim_daemon.start()
    out = run_py("""
import npusim
npusim.init()
assert npusim.get_device_count() == 3
npusim.set_device(2)
p = npusim.malloc(1 << 20)
try:
    npusim.malloc(32)
except npusim.AclError as e:
    assert e.code == 207001
else:
    raise AssertionError("allocated past the device's memory")
assert npusim.get_mem_info() == (0, 1 << 20)
npusim.free(p)
assert npusim.get_mem_info() == (1 << 20, 1 << 20)
print("ok")
""", npusim_daemon.env)
    assert out == "ok\n"


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS for {pid}")


def test_freed_device_memory_is_kept_zeroed_and_within_capacity(npusim_daemon) -> None:
    """A freed allocation's memory stays with the daemon, as a device keeps its own, and the next
    allocation of its size takes it, zeroed (it held another client's data), without faulting its
    pages in again; beside what is allocated, the daemon keeps no more than its capacity."""
    npusim_daemon.stop()
    npusim_daemon.devices, npusim_daemon.memory = 1, 64 << 20
    npusim_daemon.start()
    daemon = npusim_daemon.proc.pid

    def kept() -> int:
        return int(npusim.daemon_status(npusim_daemon.socket)["freed_kept"])

    mib = 1 << 20
    run_py("""
import npusim
npusim.init()
npusim.set_device(0)
p = npusim.malloc(32 << 20, 0)
npusim.memset(p, 0xAB, 32 << 20, None)
npusim.free(p)
""", npusim_daemon.env)
    assert kept() == 32 * mib
    before = _rss(daemon)
    out = run_py("""
import numpy as np, npusim
npusim.init()
npusim.set_device(0)
p = npusim.malloc(32 << 20, 0)
host = np.ones(32 << 20, dtype=np.uint8)
npusim.memcpy_d2h(host, p, None)
print(int(np.count_nonzero(host)))
""", npusim_daemon.env)
    assert out.split()[0] == "0", "a reused allocation held the last client's data"
    assert kept() == 32 * mib
    assert _rss(daemon) - before < 8 * mib, "the kept memory was not reused"
    # Other sizes, to the capacity: the kept 32 MiB go as the device fills (never above 64 MiB in all).
    out = run_py(f"""
import npusim
npusim.init()
npusim.set_device(0)
ps = [npusim.malloc(16 << 20, 0) for _ in range(4)]
for line in open("/proc/{daemon}/status"):
    if line.startswith("VmRSS:"):
        print(int(line.split()[1]) << 10)
""", npusim_daemon.env)
    assert int(out) - before < (64 - 32 + 8) * mib, "the daemon held freed memory beyond its capacity"
    assert kept() == 64 * mib
