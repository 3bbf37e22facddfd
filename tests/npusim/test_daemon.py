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
