"""CRIU fails or dies: killed in the middle of a dump, or refusing the target (a
connected Unix socket to an outside process). The checkpoint must fail with one line
and exit 7, and the workload must run on, unlocked, with its device data intact."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers import npusnap, npusnap_cmd

from .support import (
    assert_failed_cleanly,
    assert_no_valid_checkpoint,
    assert_running_intact,
    children,
    comm,
    partial_leftovers,
    start_train,
    with_suppress_kill,
)


def test_criu_killed_mid_dump(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env, ballast_mb=400)
    target = tmp_path / "ckpt"
    cli = subprocess.Popen([*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(target)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        killed = None
        while killed is None and cli.poll() is None:
            assert time.monotonic() < deadline, "never saw criu writing pages"
            for c in children(cli.pid):
                if comm(c) == "criu":
                    pages = [p for d in partial_leftovers(target) for p in (d / "criu").glob("pages-*.img")]
                    if any(p.stat().st_size > (16 << 20) for p in pages if p.exists()):
                        with_suppress_kill(c)
                        killed = c
            time.sleep(0.005)
        out, err = cli.communicate(timeout=60)
        assert killed is not None, f"the dump finished before criu could be killed (exit {cli.returncode})"
        r = subprocess.CompletedProcess(cli.args, cli.returncode, out, err)
        line = assert_failed_cleanly(r, {7})
        assert "criu" in line.lower() or "CRIU" in line
        assert_running_intact(w, reference, env)
        assert_no_valid_checkpoint(target)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        w.stop()


def test_criu_refuses_external_unix_socket(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    d = tempfile.mkdtemp(prefix="npf-")
    path = str(Path(d) / "outside.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(4)
    w = None
    try:
        w = start_train(tmp_path, env, connect_to=path)
        conn, _ = server.accept()  # the workload is connected to us: an external socket for CRIU
        target = tmp_path / "ckpt"
        r = npusnap("checkpoint", w.pid, "-D", target, env=env, timeout=120)
        line = assert_failed_cleanly(r, {7})
        assert "socket" in line.lower() or "logs" in line, line
        assert_running_intact(w, reference, env)
        assert_no_valid_checkpoint(target)
        conn.close()
    finally:
        server.close()
        if w is not None:
            w.stop()
        Path(path).unlink(missing_ok=True)
        Path(d).rmdir()
