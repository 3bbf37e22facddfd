"""Helpers for the direct-path tests: an npusim client process driven line by line over stdin
(it locks, backs up and restores itself, as CANN requires: pid == getpid())."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Optional

CLIENT = textwrap.dedent(r"""
    import hashlib, json, os, sys
    import numpy as np
    import npusim

    npusim.init()
    allocs = []  # (device, address, size)

    def contents():
        out = {}
        for dev, addr, size in allocs:
            npusim.set_device(dev)
            buf = np.empty(size, dtype=np.uint8)
            npusim.memcpy_d2h(buf, addr)
            out[hex(addr)] = hashlib.blake2b(buf.tobytes(), digest_size=16).hexdigest()
        return out

    def data(kind, size, seed):
        if kind == "random":
            return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
        buf = np.zeros(size, dtype=np.uint8)
        if kind == "sparse":  # 1 KiB of non-zero bytes at `seed` MiB
            off = seed << 20
            buf[off:off + 1024] = np.arange(1024) % 251 + 1
        return buf

    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        res = None
        try:
            if cmd == "alloc":  # DEVICE SIZE random|zero|sparse SEED
                dev, size, kind, seed = int(args[0]), int(args[1]), args[2], int(args[3])
                npusim.set_device(dev)
                addr = npusim.malloc(size)
                npusim.memcpy_h2d(addr, data(kind, size, seed))
                allocs.append((dev, addr, size))
                res = addr
            elif cmd == "lock":
                npusim.snapshot_lock()
            elif cmd == "unlock":
                npusim.snapshot_unlock()
            elif cmd == "backup":
                npusim.snapshot_backup()
            elif cmd == "backup_external":
                npusim.snapshot_set_data_path(True)
                npusim.snapshot_backup()
            elif cmd == "restore":
                npusim.snapshot_restore()
            elif cmd == "contents":
                res = contents()
            elif cmd == "scribble":
                for dev, addr, size in allocs:
                    npusim.set_device(dev)
                    npusim.memset(addr, 0x55, size)
            elif cmd == "info":
                res = npusim.snapshot_info()
            elif cmd == "py":  # one Python statement (a write through some path), then a device sync
                exec(" ".join(args), {"npusim": npusim, "np": np, "allocs": allocs})
                npusim.synchronize_device()
            else:
                raise SystemExit(f"unknown command {cmd}")
            print(json.dumps({"ok": True, "result": res}), flush=True)
        except npusim.AclError as e:
            print(json.dumps({"ok": False, "code": e.code, "error": str(e)}), flush=True)
""")


class ClientError(AssertionError):
    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(reply.get("error"))
        self.code = reply.get("code")


class Client:
    """One npusim client process; call(cmd) returns its result or raises ClientError."""

    def __init__(self, env: dict[str, str], extra_env: Optional[dict[str, str]] = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", CLIENT], env={**env, **(extra_env or {})},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        first = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not first:
            raise AssertionError(f"client did not start: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.pid = json.loads(first)["ready"]

    def call(self, *cmd: object) -> Any:
        self.proc.stdin.write(" ".join(map(str, cmd)) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"client died: {self.proc.stderr.read()}")  # type: ignore[union-attr]
        reply = json.loads(line)
        if not reply["ok"]:
            raise ClientError(reply)
        return reply["result"]

    def state(self) -> str:
        return str(self.call("info")["state"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for s in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if s is not None:
                s.close()


def image_size(directory: "os.PathLike[str]") -> int:
    return sum(e.stat().st_size for e in os.scandir(directory) if e.is_file())
