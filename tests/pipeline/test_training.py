"""The four-phase pipeline on examples/train.py (weights on npusim), under `npusnap run`,
with real CRIU and a real daemon: checkpoint mid-run, kill, restart the daemon (an empty
device), restore; and --leave-running, then restore the image after the original exits."""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu, rewind_to_checkpoint

from .support import strip_ready, train_argv, train_device_bytes, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 40, 3, 60  # ~2.4 s: room for a slow checkpoint on a loaded machine


PATHS = pytest.mark.parametrize("data_path", ["direct", "in-process"])


def _check_device(dev: dict, data_path: str) -> None:
    assert dev["backend"] == "sim", dev
    assert dev["devices"] == [0]
    assert dev["allocations"] == 9  # x, xt, y, w, v, err, grad, tmp, scratch
    assert dev["bytes"] == train_device_bytes()
    assert dev["method"] == data_path
    assert dev["runtime"].endswith("/libascendcl.so")


@PATHS
def test_checkpoint_kill_restart_daemon_restore_is_byte_identical(npusim_daemon, reference, tmp_path,
                                                                   data_path) -> None:
    ref = reference(train_argv(STEPS, 0))
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out",
                 env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--data-path", data_path, "--json", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["kind"] == "checkpoint" and doc["pid"] == w.pid and doc["left_running"] is False
        _check_device(doc["device"], data_path)
        assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "seal"]

        # The process is gone (killed once the checkpoint was committed), mid-run.
        assert w.proc.wait(timeout=10) == -signal.SIGKILL
        assert not pid_alive(w.pid)
        at_checkpoint = strip_ready(w.lines())
        assert AT < len(at_checkpoint) < STEPS and at_checkpoint == ref[: len(at_checkpoint)]

        # The manifest's device section and per-phase timings.
        m = yaml.safe_load((ck / "manifest.yaml").read_text())
        assert m["device"] == doc["device"]
        # The output's phases carry their steps (a profile); the manifest's only the phases.
        assert m["phases"] == [{k: v for k, v in p.items() if k != "parts"} for p in doc["phases"]]
        steps = {p["name"]: p["parts"] for p in doc["phases"]}
        if data_path == "direct":  # the daemon wrote the images while CRIU dumped; the seal waited for it
            assert set(steps["seal"]) == {"device-write", "device-write-wait", "checksums", "fsync"}
            assert set(steps["backup"]) == {"snapshot", "backup-external"}
            assert steps["seal"]["device-write"]["bytes"] == sum(f["size"] for f in m["files"]
                                                                 if f["path"].startswith("device/"))
        else:
            assert set(steps["seal"]) == {"checksums", "fsync"}
        phases = {p["name"]: p for p in m["phases"]}
        assert all(isinstance(p["seconds"], float) and p["seconds"] >= 0 for p in m["phases"])
        assert phases["backup"]["bytes"] == train_device_bytes()
        criu_bytes = sum(f["size"] for f in m["files"] if f["path"].startswith("criu/"))
        device_bytes = sum(f["size"] for f in m["files"] if f["path"].startswith("device/"))
        assert phases["dump"]["bytes"] == phases["seal"]["bytes"] == criu_bytes
        if data_path == "in-process":  # the backed-up device memory lives in the process: CRIU dumps it too
            assert criu_bytes > train_device_bytes() and device_bytes == 0
        else:  # the daemon wrote it straight into device/; the process holds only metadata
            assert 0 < device_bytes <= train_device_bytes() * 1.01 + (64 << 10)  # + the images' index
        assert [p["pid"] for p in m["processes"]] == [w.pid]

        # Nothing of it stays counted on the device (the direct path's memory kept across the
        # backup, for a rollback, is free once the process is killed).
        st = npusnap("device", "status", "--json", env=npusim_daemon.env)
        assert all(d["used"] == 0 for d in json.loads(st.stdout)["devices"]), st.stdout

        npusim_daemon.restart()  # a fresh, empty device
        gate.open()
        rs = npusnap("restore", ck, "--json", env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, rs.stderr  # the workload's own exit code, in the foreground
        rdoc = json.loads(rs.stdout)
        assert rdoc["pid"] == w.pid and rdoc["exit_code"] == 0
        assert [p["name"] for p in rdoc["phases"]] == ["verify", "criu-restore", "device-restore", "unlock"]
        assert rdoc["phases"][2]["bytes"] == train_device_bytes()
        assert "criu" in rdoc["phases"][1]["parts"]
        if data_path == "direct":
            # Read while CRIU restored the tree (the import ahead), so the import after it reads nothing.
            assert rdoc["phases"][1]["parts"]["import-ahead"]["bytes"] == device_bytes
            assert set(rdoc["phases"][2]["parts"]) == {"restore-external", "import"}
            assert rdoc["phases"][2]["parts"]["import"]["bytes"] == 0
        assert strip_ready(w.lines()) == ref
    finally:
        w.stop()


@PATHS
def test_leave_running_then_restore_the_image_after_it_exits(npusim_daemon, reference, tmp_path, data_path) -> None:
    ref = reference(train_argv(STEPS, 0))
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent(train_argv(STEPS, SLEEP_MS)), tmp_path / "train.out",
                 env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--leave-running", "--data-path", data_path, "--json",
                    env=npusim_daemon.env)
        gate.open()
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["left_running"] is True
        _check_device(doc["device"], data_path)
        assert w.proc.wait(timeout=60) == 0  # the original carries on, device intact, to the end
        assert strip_ready(w.lines()) == ref

        # The restored copy re-runs the tail from the checkpoint, on the same daemon (the original's
        # device addresses are free again now that it exited).
        rewind_to_checkpoint(ck, w.out)
        assert len(strip_ready(w.lines())) < STEPS
        rs = npusnap("restore", ck, env=npusim_daemon.env, timeout=120)
        assert rs.returncode == 0, rs.stderr
        assert strip_ready(w.lines()) == ref
    finally:
        w.stop()
