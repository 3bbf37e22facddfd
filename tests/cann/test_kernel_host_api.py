"""The runtime calls that came with the kernel samples' host code (tests/cann/kernel_host_api.c),
their semantics checked: aclDataBuffer, aclrtResetEvent (a wait after a reset waits for the next
record), device status and utilization, mstx marks and ranges in the profiler's data, the dump settings of aclInit's JSON
configuration, acldumpSaveExceptionInfo's file and aclopStartDumpArgs' kernel-argument lines."""

from __future__ import annotations

import json
import struct
import subprocess


def test_data_buffers_reset_event_mstx_and_dump(build_program, device_env, kernels_so, npusim_daemon,
                                                 tmp_path) -> None:
    exe = build_program("kernel_host_api")
    dump_dir, prof_dir, args_dir = tmp_path / "dump", tmp_path / "prof", tmp_path / "args"
    for d in (dump_dir, args_dir):
        d.mkdir()
    config = tmp_path / "acl.json"
    config.write_text(json.dumps({"dump": {"dump_path": str(dump_dir), "dump_op_switch": "on",
                                           "dump_scene": "aic_err_brief_dump"}}))
    r = subprocess.run([str(exe), str(config), str(prof_dir), str(args_dir), str(kernels_so)],
                       env={**npusim_daemon.env, "LD_LIBRARY_PATH": device_env["LD_LIBRARY_PATH"]},
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line.startswith("ok ")] == ["ok data buffers", "ok reset event",
                                                                   "ok device queries", "ok mstx", "ok dump"]
    assert f"data dump path {dump_dir}" in lines and lines[-1] == "done"

    # mstx: marks and nested ranges, a domain's name before its messages
    (prof,) = prof_dir.glob("npusim_prof_*.jsonl")
    records = [json.loads(line) for line in prof.read_text().splitlines()]
    marks = [x["message"] for x in records if x["kind"] == "mark"]
    ranges = {x["message"]: x for x in records if x["kind"] == "range"}
    assert marks == ["plain mark", "demo: domain mark"]
    assert set(ranges) == {"outer range", "demo: inner range"}
    outer, inner = ranges["outer range"], ranges["demo: inner range"]
    assert outer["start_ns"] <= inner["start_ns"] <= inner["end_ns"] <= outer["end_ns"]

    # acldumpSaveExceptionInfo: the description, then the device tensor's and the host tensor's bytes
    (dump,) = dump_dir.glob("check_*.dump")
    head, data = dump.read_bytes().split(b"\ndata\n", 1)
    assert head.decode().splitlines() == [
        "npusim exception dump", "tag: stage=test",
        "tensor 0: input dtype=0 format=0 size=1024 shape=[16,16]",
        "tensor 1: output dtype=0 format=0 size=16 shape=[4]"]
    assert data == struct.pack("<256f", *[i * 0.5 for i in range(256)]) + struct.pack("<4f", 1.5, -2.0, 3.25, 0.0)

    # aclopStartDumpArgs: the one launch made while it was on, with its argument bytes
    (args,) = args_dir.glob("npusim_aicore_args_*.txt")
    x = int(next(line for line in lines if line.startswith("args ")).split()[1], 16)
    expected = struct.pack("<QQQQ", x, x, x, 4).hex()
    assert args.read_text().splitlines() == [f"kernel=vadd blocks=2 args={expected}"]
