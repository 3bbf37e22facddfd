"""Measurements for the direct path (a script, not a test):

  python -m tests.direct.measure_direct [DIR] [--gib N]

1. export throughput of N GiB of non-zero device memory vs a plain fsync'd write of N GiB in DIR;
2. peak RSS (VmHWM) of the client process during the direct path vs the in-process path, and the
   daemon's extra peak memory during the export.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import npusim

from tests.conftest import NpuSimDaemon

MiB = 1 << 20
def hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def drop_caches() -> None:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        pass


def plain_write(d: Path, size: int) -> float:
    buf = os.urandom(64 * MiB)
    path = d / "plain.bin"
    drop_caches()
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size
        while left:
            left -= os.write(fd, buf[: min(left, len(buf))])
        os.fsync(fd)
    finally:
        os.close(fd)
    secs = time.monotonic() - t0
    path.unlink()
    return size / secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default="/var/tmp")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    size = int(args.gib * (1 << 30))
    work = Path(tempfile.mkdtemp(prefix="npusnap-direct-", dir=args.dir))
    sockdir = tempfile.mkdtemp(prefix="nx-")
    daemon = NpuSimDaemon(socket=os.path.join(sockdir, "d.sock"), devices=1, memory=size + 64 * MiB)
    daemon.env = {**os.environ, "NPUSIM_SOCKET": daemon.socket}
    daemon.start()
    assert daemon.proc is not None
    try:
        # -- 1. throughput
        import subprocess

        # A client that fills its memory on the device: a small dedicated script.

        code = (
            "import os, sys, npusim\n"
            "npusim.init(); npusim.set_device(0)\n"
            f"n = {size}\n"
            "a = npusim.malloc(n)\n"
            "for i in range(n >> 20):\n"
            "    npusim.launch_fill(a + (i << 20), (1 << 20) // 4, float(i + 1))\n"
            "npusim.synchronize_device()\n"
            "print('ready', flush=True)\n"
            "for line in sys.stdin:\n"
            "    cmd = line.strip()\n"
            "    if cmd == 'lock': npusim.snapshot_lock()\n"
            "    elif cmd == 'unlock': npusim.snapshot_unlock()\n"
            "    elif cmd == 'backup': npusim.snapshot_backup()\n"
            "    elif cmd == 'backup_external': npusim.snapshot_set_data_path(True); npusim.snapshot_backup()\n"
            "    elif cmd == 'restore': npusim.snapshot_restore()\n"
            "    print('ok', flush=True)\n"
        )

        def client() -> subprocess.Popen:
            p = subprocess.Popen([sys.executable, "-u", "-c", code], env=daemon.env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            return p

        def cmd(p: subprocess.Popen, c: str) -> None:
            p.stdin.write(c + "\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
            assert p.stdout.readline().strip() == "ok"  # type: ignore[union-attr]

        p = client()
        cmd(p, "lock")
        plain, direct, daemon_extra = [], [], []
        for run in range(args.runs):
            plain.append(plain_write(work, size))
            out = work / f"export{run}"
            out.mkdir()
            drop_caches()
            before = hwm_kib(daemon.proc.pid)
            t0 = time.monotonic()
            res = npusim.export_client(daemon.socket, p.pid, out)
            secs = time.monotonic() - t0
            daemon_extra.append(hwm_kib(daemon.proc.pid) - before)
            direct.append(res["written_bytes"] / secs)
            shutil.rmtree(out)
        cmd(p, "unlock")
        p.kill()
        p.wait()
        print(f"plain fsync'd write of {args.gib:g} GiB: " + ", ".join(f"{x / MiB:.0f}" for x in plain) + " MiB/s")
        print(f"direct export of {args.gib:g} GiB:       " + ", ".join(f"{x / MiB:.0f}" for x in direct) + " MiB/s")
        ratios = [d / pl for d, pl in zip(direct, plain)]
        print("ratio export/plain per run: " + ", ".join(f"{r:.2f}" for r in ratios)
              + f"; best-of: {max(direct) / max(plain):.2f}, median-of: {sorted(direct)[len(direct)//2] / sorted(plain)[len(plain)//2]:.2f}")
        print(f"daemon peak-RSS growth during export: {max(daemon_extra) / 1024:.1f} MiB")

        # -- 2. client peak RSS: in-process backup vs direct (export + backup external)
        for path in ("in-process", "direct"):
            p = client()
            base = hwm_kib(p.pid)
            cmd(p, "lock")
            if path == "direct":
                out = work / "rss"
                out.mkdir(exist_ok=True)
                npusim.export_client(daemon.socket, p.pid, out)
                cmd(p, "backup_external")
            else:
                cmd(p, "backup")
            peak = hwm_kib(p.pid)
            print(f"client VmHWM {path:10s}: before lock {base / 1024:.0f} MiB, after backup {peak / 1024:.0f} MiB "
                  f"(+{(peak - base) / 1024:.0f} MiB)")
            p.kill()
            p.wait()
            shutil.rmtree(work / "rss", ignore_errors=True)
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sockdir, ignore_errors=True)


if __name__ == "__main__":
    main()
