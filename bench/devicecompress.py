"""Compressed device images (--compress on the direct data path): bytes and time against a plain
direct checkpoint, side by side in one run.

    python -m bench.devicecompress [--mib 256] [--repeat 3] [--out FILE.json]

The workload holds a training state in npusim device memory: weights and Adam's two moments,
a third each, float32 arrays holding bf16-precision values (as mixed-precision training keeps
its master copies after a bf16 round trip: the low 16 bits of every float are zero, the rest is
random normal data of each tensor's scale; not zeros, and not all-random bytes either). It is
checkpointed with --leave-running, each way into a fresh parent directory (an empty store), on
three sinks: the disk (the work directory; its fsync'd write rate measured in the same run), a
tmpfs (/dev/shm: memory, faster than any codec), and a slow disk: the same disk with every byte
written for the checkpoint charged at SLOW_MBPS (NPUSNAP_TEST_DISK_MBPS: a rate-limited writer,
since this machine has no throttled block device; the export's bytes from when it wrote them,
CRIU's at the seal, the store's chunks as they are written, fsync waiting for all):
  plain                 --data-path direct (the reference, on each sink)
  zstd | lz4 | auto     the same with --compress X
  auto-2nd              a second --compress auto checkpoint into the same parent directory: the
                        first's verdict (kept in the store) followed, no probe. The first is
                        untimed, taken before the sink's plain one (so that the second follows
                        another way's checkpoint as every way does), then removed with its
                        chunks (the verdict kept: the second stores the state afresh)
The codecs' single-thread rates and ratios on a sample of the same state are reported beside.
Bytes are the device images' bytes on disk (what the store took for them, and what stayed a
plain file in DIR/device: plain, auto's first into a store, and auto once it found compressing
does not pay); time is the CLI's wall time, and the checkpoint's phases (lock..seal), median of
--repeat; each checkpoint starts after a sync (the one before it written back: on a fast disk its
write-back would otherwise land in the next one's fsyncs, whichever way that is). Host pages are
packed too under --compress; their bytes are reported apart.
Figures, not pass/fail: nothing here asserts a time."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from statistics import median
from typing import Any

from .util import Resources, child_env, npusnap, npusnap_exe, rows_main, start_workload

WORKLOAD = r"""
import json, sys, time
import numpy as np
import npusim

size = int(sys.argv[1]) << 20
npusim.init()
npusim.set_device(0)
rng = np.random.default_rng(7)
for scale in (0.02, 1e-3, 1e-6):  # weights, first and second moments
    n = size // 3 // 4
    a = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
    a = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    buf = npusim.malloc(a.nbytes)
    npusim.memcpy_h2d(buf, a.view(np.uint8))
npusim.synchronize_device()
print("ready " + json.dumps({"device_bytes": size}), flush=True)
time.sleep(3600)
"""


def _phases_s(data: dict[str, Any]) -> float:
    return sum(float(p["seconds"]) for p in data.get("phases", []))


def _phase_s(data: dict[str, Any], name: str) -> float:
    return sum(float(p["seconds"]) for p in data.get("phases", []) if p.get("name") == name)


def _inspect(ck: Path, env: dict[str, str], work: Path) -> dict[str, Any]:
    return npusnap(["inspect", ck], env=env, workdir=work).data


WAYS = [("plain", ()), ("zstd", ("--compress", "zstd")), ("lz4", ("--compress", "lz4")),
        ("auto", ("--compress", "auto")), ("auto-2nd", ("--compress", "auto"))]
SAMPLE = 32 << 20
SLOW_MBPS = 150  # the slow sink: a disk (or network file system) of this rate, emulated (testhooks.disk)


def _disk_rate(directory: Path) -> float:
    """The sink's fsync'd write rate (MB/s), in this run: 64 MiB written and fsync'd."""
    import time

    path = directory / "rate.tmp"
    data = os.urandom(1 << 20)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for _ in range(64):
            os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return 64 * (1 << 20) / (time.perf_counter() - t) / 1e6


def _codec_rates() -> dict[str, Any]:
    """Each codec's single-thread rate (MB/s) and ratio on a sample of the same training state,
    1 MiB chunks, and the threads the checkpoint compresses on."""
    import time

    import numpy as np

    from npusnap_cli.image.codecs import compress, workers

    rng = np.random.default_rng(7)
    a = rng.standard_normal(SAMPLE // 4, dtype=np.float32) * np.float32(0.02)
    raw = (a.view(np.uint32) & np.uint32(0xFFFF0000)).tobytes()
    out: dict[str, Any] = {"threads": workers()}
    for codec in ("zstd", "lz4"):
        t, stored = time.perf_counter(), 0
        for off in range(0, len(raw), 1 << 20):
            stored += len(compress(codec, raw[off:off + (1 << 20)]))
        out[codec] = {"mb_s": round(len(raw) / (time.perf_counter() - t) / 1e6, 1),
                      "ratio": round(len(raw) / stored, 3)}
    return out


def run(mib: int, repeat: int, work: Path) -> dict[str, Any]:
    from npusnap_cli.platform import simdaemon

    with Resources() as res:
        sock = str(work / "dc.sock")
        res.daemons.append(sock)
        simdaemon.start(sock, devices=1, memory=2 * (mib << 20) + (64 << 20))
        env = child_env({"NPUSIM_SOCKET": sock})
        script = work / "devicecompress_workload.py"
        script.write_text(WORKLOAD)
        w = start_workload(res, [*npusnap_exe(), "run", "--", sys.executable, str(script), str(mib)],
                           work / "workload.out", env=env)
        shm = res.mkdtemp(Path("/dev/shm"), "npusnap-bench-devc-")
        sinks = {"disk": (work, env), "tmpfs": (shm, env),
                 "slow": (work, {**env, "NPUSNAP_TEST_DISK_MBPS": str(SLOW_MBPS)})}
        rates = {"disk_mb_s": round(_disk_rate(work), 1), **_codec_rates()}
        rows: dict[str, Any] = {}
        for i in range(repeat):  # the ways interleaved: a busy machine's drift hits them alike
            for sink, (base, sink_env) in sinks.items():
                first = base / f"auto-2nd-{i}"  # auto-2nd's first, untimed: it probes and leaves its verdict
                first.mkdir()
                npusnap(["checkpoint", w.pid, "-D", first / "ck0", "--leave-running", "--data-path", "direct",
                         "--compress", "auto"], env=sink_env, workdir=work)
                shutil.rmtree(first / "ck0")
                shutil.rmtree(first / ".npusnap-store" / "packs", ignore_errors=True)
                for way, flags in WAYS:
                    parent = base / f"{way}-{i}"
                    parent.mkdir(exist_ok=way == "auto-2nd")
                    ck = parent / "ck"
                    os.sync()  # the previous checkpoint's write-back is not charged to this one
                    r = npusnap(["checkpoint", w.pid, "-D", ck, "--leave-running", "--data-path", "direct",
                                 *flags], env=sink_env, workdir=work)
                    doc = _inspect(ck, env, work)
                    dev = doc.get("device_images") or {}
                    # what the store took, and what stayed a plain file (plain; auto when it does not pay)
                    on_disk = int(dev.get("new_bytes", 0)) + sum(p.stat().st_size for p in (ck / "device").iterdir())
                    row = rows.setdefault(f"{way}@{sink}", {"seconds": [], "phases_s": [], "backup_s": [],
                                                            "seal_s": []})
                    row["seconds"].append(r.seconds)
                    row["phases_s"].append(_phases_s(r.data))
                    row["backup_s"].append(_phase_s(r.data, "backup"))
                    row["seal_s"].append(_phase_s(r.data, "seal"))
                    row["device_bytes"] = on_disk
                    row["device_raw"] = int(dev.get("raw_bytes", 0)) + int(dev.get("plain_bytes", 0)) or on_disk
                    row["compressed_share"] = round(int(dev.get("compressed_bytes", 0)) / max(row["device_raw"], 1), 3)
                    row["codec"] = dev.get("codec", "raw")
                    row["host_pages_stored"] = int((doc.get("host_pages") or {}).get("new_bytes", 0))
                    shutil.rmtree(parent)
        for row in rows.values():
            for k in ("seconds", "phases_s", "backup_s", "seal_s"):
                row[k] = round(median(row[k]), 4)
        for key, row in rows.items():
            plain = rows["plain@" + key.split("@")[1]]
            row["smaller_x"] = round(plain["device_bytes"] / max(row["device_bytes"], 1), 3)
            row["time_ratio"] = round(row["seconds"] / plain["seconds"], 3)
            row["phases_ratio"] = round(row["phases_s"] / plain["phases_s"], 3)
        return {"state_mib": mib, "repeat": repeat, "rates": rates,
                "state": "weights + 2 Adam moments, float32 holding bf16-precision values", "rows": rows}


def main() -> None:
    rows_main(__doc__ or "", "npusnap-bench-devc-", 256, run,
              lambda r: f"device {r['device_bytes'] / 2**20:8.1f} MiB ({r['smaller_x']:.2f}x smaller), "
                        f"{r['seconds']:.2f} s ({r['time_ratio']:.2f}x plain; phases {r['phases_ratio']:.2f}x), "
                        f"codec {r['codec']} ({r['compressed_share']:.0%} of it compressed)")


if __name__ == "__main__":
    main()
