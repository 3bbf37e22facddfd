"""restore --lazy against the full restore: a workload holding H bytes of host memory and D bytes of
random npusim device memory runs steps back to back (each reads one random 1 MiB chunk of device
memory and writes one host page: an embedding-style step, not one that sweeps every weight) and
is checkpointed once (killed, direct data path). Its checkpoint is then restored both ways,
alternately, with the page cache dropped where we may (else evicted file by file): the figure
is the time from the restore command's start to the workload's first step after it (the
issue's target: lazy <= 0.2x full), and the full restore's command time beside it.

    python -m bench.lazy [--host 1G] [--device 3G] [--repeat 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .util import BenchError, Resources, child_env, evict, median, npusnap, npusnap_exe, reap, start_workload, unfit

WORKLOAD = r"""
import os, random, sys, time
import numpy as np
import npusim

host_bytes, dev_bytes = int(sys.argv[1]), int(sys.argv[2])
MiB = 1 << 20
npusim.init()
npusim.set_device(0)
bufs, left = [], dev_bytes
while left > 0:
    n = min(256 * MiB, left)
    b = npusim.malloc(n)
    for off in range(0, n, 64 * MiB):
        k = min(64 * MiB, n - off)
        npusim.memcpy_h2d(b + off, np.random.default_rng(len(bufs) * 97 + off).integers(0, 256, k, dtype=np.uint8))
    bufs.append((b, n))
    left -= n
host = np.random.default_rng(7).integers(0, 256, host_bytes, dtype=np.uint8)
chunk = np.empty(MiB, dtype=np.uint8)
print("ready {}", flush=True)
rng = random.Random(os.getpid())
step = 0
deadline = time.monotonic() + 3600
while time.monotonic() < deadline:
    b, n = bufs[rng.randrange(len(bufs))]
    npusim.memcpy_d2h(chunk, b + rng.randrange(n // MiB) * MiB)
    host[rng.randrange(host_bytes // 4096) * 4096] += chunk[0]
    print(f"step {step} {time.time():.6f}", flush=True)
    step += 1
    time.sleep(0.01)
"""


def _wait_line(out: Path, prefix: str, after: int, timeout: float) -> float:
    """time.time() of the first line starting with prefix beyond byte offset after, as it shows up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(out, "rb") as f:
            f.seek(after)
            for line in f.read().decode(errors="replace").splitlines():
                if line.startswith(prefix):
                    return time.time()
        time.sleep(0.002)
    raise BenchError(f"no {prefix!r} line in {out} within {timeout:.0f} s")


def _drop_cache(ckpt: Path) -> None:
    try:
        subprocess.run(["sync"], check=False, timeout=120)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        evict(ckpt)


def _one(res: Resources, ckpt: Path, out: Path, env: dict[str, str], workdir: Path, lazy: bool) -> dict[str, Any]:
    size = os.path.getsize(out)
    _drop_cache(ckpt)
    args = ["restore", ckpt, "--detach", "--json", "--pidfile", workdir / "lazy.pid"] + (["--lazy"] if lazy else [])
    t0 = time.time()
    proc = subprocess.Popen([*npusnap_exe(), *map(str, args)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = _wait_line(out, "step ", size, timeout=900) - t0
        data, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    command = time.time() - t0
    if proc.returncode != 0:
        raise BenchError(f"restore{' --lazy' if lazy else ''} failed ({proc.returncode}): {err.decode()[-400:]}")
    pid = int((workdir / "lazy.pid").read_text().split()[0])
    res.add_pid(pid)
    # The output file must be back at its checkpointed size for the next restore.
    res.kill(pid)
    reap(pid)
    with open(out, "r+b") as f:
        f.truncate(size)
    doc = json.loads(data)
    return {"first_step_s": first, "command_s": command,
            "phases": {p["name"]: round(float(p["seconds"]), 3) for p in doc.get("phases", [])}}


def measure(res: Resources, workdir: Path, host_bytes: int, device_bytes: int, repeat: int = 2) -> dict[str, Any]:
    from npusnap_cli.platform import simdaemon

    sock = str(workdir / "lazy.sock")
    res.daemons.append(sock)
    simdaemon.start(sock, devices=1, memory=device_bytes + (256 << 20))
    env = child_env({"NPUSIM_SOCKET": sock})
    script = workdir / "lazy_workload.py"
    script.write_text(WORKLOAD)
    out = workdir / "lazy.out"
    argv = [*npusnap_exe(), "run", "--", sys.executable, str(script), str(host_bytes), str(device_bytes)]
    w = start_workload(res, argv, out, env=env, timeout=600)  # filling D bytes of random data takes a while
    ckpt = workdir / "lazy-ck"
    try:
        _wait_line(out, "step ", 0, timeout=120)
        npusnap(["checkpoint", w.pid, "-D", ckpt, "--data-path", "direct"], env=env, workdir=workdir)
        reap(w.pid)
        full: list[dict[str, Any]] = []
        lazy: list[dict[str, Any]] = []
        for _ in range(repeat):  # alternately: the machine's load drifts alike for both
            full.append(_one(res, ckpt, out, env, workdir, lazy=False))
            lazy.append(_one(res, ckpt, out, env, workdir, lazy=True))
        f_first = median([s["first_step_s"] for s in full])
        l_first = median([s["first_step_s"] for s in lazy])
        return {
            "host_bytes": host_bytes, "device_bytes": device_bytes, "samples": repeat,
            "full": {"first_step_s": f_first, "command_s": median([s["command_s"] for s in full]),
                     "phases": full[-1]["phases"]},
            "lazy": {"first_step_s": l_first, "command_s": median([s["command_s"] for s in lazy]),
                     "phases": lazy[-1]["phases"]},
            "first_step_ratio": round(l_first / f_first, 4) if f_first else None,
            "target_ratio": 0.2,
        }
    finally:
        res.kill(w.pid)
        shutil.rmtree(ckpt, ignore_errors=True)


def fits(workdir: Path, host_bytes: int, device_bytes: int) -> Optional[str]:
    """Why this size cannot run here (memory: the workload, the daemon and the images in the cache)."""
    return unfit(2 * (host_bytes + device_bytes) + (1 << 30), host_bytes + device_bytes + (256 << 20), workdir)


def main(argv: Optional[list[str]] = None) -> int:
    from .config import human, parse_sizes
    from .util import measure_alone

    ap = argparse.ArgumentParser(prog="python -m bench.lazy", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--host", default="1G")
    ap.add_argument("--device", default="3G")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = ap.parse_args(argv)
    host, dev = parse_sizes(args.host)[0], parse_sizes(args.device)[0]

    def run(res: Resources, dirs: list[Path]) -> dict[str, Any]:
        why = fits(dirs[0], host, dev)
        if why:
            raise BenchError(f"{human(host)} host + {human(dev)} device does not fit here: {why}")
        return measure(res, dirs[0], host, dev, args.repeat)

    return measure_alone("lazy", [args.dir], run, line=row)


def row(doc: dict[str, Any]) -> str:
    from .config import human

    return (f"lazy restore ({human(doc['host_bytes'])} host + {human(doc['device_bytes'])} device): first step "
            f"after {doc['lazy']['first_step_s']:.3f} s lazy vs {doc['full']['first_step_s']:.3f} s full "
            f"(ratio {doc['first_step_ratio']}, target <= {doc['target_ratio']}); full restore command "
            f"{doc['full']['command_s']:.3f} s, lazy command (all memory in) {doc['lazy']['command_s']:.3f} s")


if __name__ == "__main__":
    sys.exit(main())
