"""A process set end to end: three examples/train.py runs under `npusnap run` (on npusim devices
0, 1 and 0 again), checkpointed together by `npusnap checkpoint PID PID PID` with real CRIU,
killed, the daemon restarted (an empty device), and restored together by `npusnap restore`:
every member's output bit-identical to an uninterrupted run. inspect, verify and list read the
set; --leave-running runs every member on."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu

from .support import status, strip_ready, train_argv, train_device_bytes, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

STEPS, AT, SLEEP_MS = 80, 3, 60  # ~5 s: the members still run when a slow checkpoint starts
DEVICES = (0, 1, 0)  # two members share device 0: their allocations keep their own addresses


def _train(device: int, sleep_ms: int = SLEEP_MS) -> list[str]:
    return [*train_argv(STEPS, sleep_ms), "--device", str(device)]


def _start(tmp_path: Path, env: dict[str, str]) -> list[Workload]:
    ws: list[Workload] = []
    try:
        for i, device in enumerate(DEVICES):
            ws.append(Workload(under_agent(_train(device)), tmp_path / f"train{i}.out", env=env))
        for w in ws:
            w.wait_for_line(f"step {AT} ", timeout=60)
    except BaseException:
        for w in ws:
            w.stop()
        raise
    return ws


@pytest.mark.parametrize("data_path", ["direct", "in-process"])
def test_a_set_checkpointed_killed_and_restored_is_bit_identical(npusim_daemon, reference, tmp_path,
                                                                 data_path) -> None:
    refs = {device: reference(_train(device, 0)) for device in set(DEVICES)}
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    ws = _start(tmp_path, {**npusim_daemon.env, **gate.env})
    try:
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", *(w.pid for w in ws), "-D", ck, "--data-path", data_path, "--json",
                    env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["pids"] == [w.pid for w in ws] and doc["left_running"] is False
        assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "seal"]
        assert doc["device"]["devices"] == [0, 1] and doc["device"]["bytes"] == 3 * train_device_bytes()
        for member, w, device in zip(doc["members"], ws, DEVICES):
            assert member["pid"] == w.pid and member["device"]["devices"] == [device]
            assert member["device"]["method"] == data_path and member["bytes"] > 0
        for w in ws:  # every member killed once the set was committed, mid-run
            assert w.proc.wait(timeout=10) == -signal.SIGKILL
            assert AT < len(strip_ready(w.lines())) < STEPS

        m = yaml.safe_load((ck / "manifest.yaml").read_text())
        assert m["format_version"] == 2 and [e["pid"] for e in m["members"]] == [w.pid for w in ws]
        for w in ws:
            assert any(f["path"].startswith(f"criu/{w.pid}/pages-") for f in m["files"])
            assert (data_path == "direct") == any(f["path"].startswith(f"device/{w.pid}/") for f in m["files"])
        v = npusnap("verify", ck, "--json", check=True)
        vdoc = json.loads(v.stdout)
        assert [x["pid"] for x in vdoc["members"]] == [w.pid for w in ws]
        assert sum(x["bytes"] for x in vdoc["members"]) == vdoc["bytes"]
        ins = json.loads(npusnap("inspect", ck, "--json", check=True).stdout)
        assert [x["checksum"] for x in ins["members"]] == [x["checksum"] for x in vdoc["members"]]
        assert {p["pid"] for p in ins["processes"]} >= {w.pid for w in ws}
        assert all(p["memory"]["dumped"] > 0 for p in ins["processes"] if p["pid"] in {w.pid for w in ws})
        listed = json.loads(npusnap("list", tmp_path, "--json", check=True).stdout)["checkpoints"]
        assert [c["state"] for c in listed] == ["valid"] and len(listed[0]["members"]) == 3

        npusim_daemon.restart()  # a fresh, empty device
        gate.open()
        rs = npusnap("restore", ck, "--json", env=npusim_daemon.env, timeout=180)
        assert rs.returncode == 0, rs.stderr
        rdoc = json.loads(rs.stdout)
        assert rdoc["pids"] == [w.pid for w in ws] and rdoc["exit_code"] == 0
        assert [x["exit_code"] for x in rdoc["members"]] == [0, 0, 0]
        assert all([p["name"] for p in x["phases"]] == ["criu-restore", "device-restore"] for x in rdoc["members"])
        for w, device in zip(ws, DEVICES):
            assert strip_ready(w.lines()) == refs[device]
    finally:
        for w in ws:
            w.stop()


def test_leave_running_runs_every_member_on_unlocked(npusim_daemon, reference, tmp_path) -> None:
    """Every member runs on, bit-exact, its device memory taken back in place (the daemon kept it
    across the backup), never read back from its images: they are damaged right after the commit."""
    from tests.faults.support import PausedCli

    refs = {device: reference(_train(device, 0)) for device in set(DEVICES)}
    gate = StepGate(tmp_path / "gate", STEPS - 2)  # the members still run when the checkpoint returns, however late
    ws = _start(tmp_path, {**npusim_daemon.env, **gate.env})
    go = tmp_path / "go"
    cli = None
    try:
        cli = PausedCli(["checkpoint", *(w.pid for w in ws), "-D", tmp_path / "ck", "--leave-running"], "commit",
                        {**npusim_daemon.env, "NPUSNAP_TEST_PAUSE_UNTIL": str(go)})
        images = sorted((tmp_path / "ck" / "device").glob("*/*.img"))
        assert {p.parent.name for p in images} == {str(w.pid) for w in ws}
        for p in images:
            with open(p, "r+b") as f:
                f.seek(p.stat().st_size // 2)
                data = f.read(64)
                f.seek(-len(data), os.SEEK_CUR)
                f.write(bytes(b ^ 0xFF for b in data))
        go.touch()
        _, err = cli.proc.communicate(timeout=120)
        assert cli.proc.returncode == 0, cli.stderr + err.decode()
        assert "checkpointed the set" in cli.stderr + err.decode()
        for w in ws:
            assert pid_alive(w.pid) and status(w.pid, npusim_daemon.env)["state"] == "RUNNING"
        gate.open()
        for w, device in zip(ws, DEVICES):
            assert w.proc.wait(timeout=180) == 0
            assert strip_ready(w.lines()) == refs[device]
        assert npusnap("verify", tmp_path / "ck").returncode == 8  # the damage is there, and caught
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        for w in ws:
            w.stop()


def test_members_with_different_backends_make_one_set(npusim_daemon, reference, tmp_path) -> None:
    """A training on npusim and a plain process (no device runtime: backend none) in one set."""
    ref = reference(_train(1, 0))
    counter = [sys.executable, "-c", "import time\nfor i in range(100000):\n    print(i, flush=True)\n"
               "    time.sleep(0.05)\n"]
    train = Workload(under_agent(_train(1)), tmp_path / "train.out", env=npusim_daemon.env)
    plain = Workload(counter, tmp_path / "plain.out", env=npusim_daemon.env)
    try:
        train.wait_for_line(f"step {AT} ", timeout=60)
        plain.wait_for_line("3", timeout=60)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", train.pid, plain.pid, "-D", ck, "--json", env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [m["device"]["backend"] for m in doc["members"]] == ["sim", "none"]
        assert doc["device"]["backend"] == "mixed" and doc["device"]["devices"] == [1]
        for w in (train, plain):
            assert w.proc.wait(timeout=10) == -signal.SIGKILL
        counted = len(plain.lines())
        npusim_daemon.restart()
        rs = npusnap("restore", ck, "--detach", "--json", env=npusim_daemon.env, timeout=180)
        assert rs.returncode == 0, rs.stderr
        assert json.loads(rs.stdout)["pids"] == [train.pid, plain.pid]
        plain.wait_for_line(str(counted + 3), timeout=60)  # counting on from where it was
        assert plain.lines()[: counted + 3] == [str(i) for i in range(counted + 3)]
        deadline = time.monotonic() + 120
        while pid_alive(train.pid):  # not our child any more: it exits on its own
            assert time.monotonic() < deadline, "the restored training did not finish"
            time.sleep(0.1)
        assert strip_ready(train.lines()) == ref
    finally:
        for w in (train, plain):
            w.stop()
            if pid_alive(w.pid):
                os.kill(w.pid, signal.SIGKILL)


def test_a_flipped_byte_in_a_members_pages_runs_no_member(npusim_daemon, tmp_path) -> None:
    """Every member's page images are checked while CRIU restores the members (all at once), each
    tree left stopped: one bad byte in member 2's pages, and no member ever runs a step (each is
    killed where CRIU left it); the error names the image. The pages put back, the set restores."""
    ws = _start(tmp_path, npusim_daemon.env)
    try:
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", *(w.pid for w in ws), "-D", ck, env=npusim_daemon.env)
        assert r.returncode == 0, r.stderr
        for w in ws:
            w.proc.wait(timeout=10)
        pages = sorted((ck / "criu" / str(ws[1].pid)).glob("pages-*.img"), key=lambda p: p.stat().st_size)[-1]
        good = pages.read_bytes()
        pages.write_bytes(good[:4096] + bytes([good[4096] ^ 1]) + good[4097:])
        before = [w.lines() for w in ws]
        rs = npusnap("restore", ck, "--detach", env=npusim_daemon.env, timeout=180)
        assert rs.returncode == 8, rs.stderr  # ImageInvalid
        assert pages.name in rs.stderr and "Traceback" not in rs.stderr, rs.stderr
        deadline = time.monotonic() + 30
        while any(pid_alive(w.pid) for w in ws) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(w.pid) for w in ws)
        assert [w.lines() for w in ws] == before  # not one step ran on the bad pages
        pages.write_bytes(good)
        rs = npusnap("restore", ck, "--detach", env=npusim_daemon.env, timeout=180)
        assert rs.returncode == 0, rs.stderr
        assert all(pid_alive(w.pid) for w in ws)
    finally:
        for w in ws:
            w.stop()
