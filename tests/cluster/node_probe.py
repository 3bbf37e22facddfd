"""Run as a Slurm task on a test-cluster node: what the task sees of its node (name, hostname,
address, the npusim daemon it finds with no setup of its own), proven by using the device:
a round trip through device memory. Prints one JSON line; with a directory argument also
writes it there as NODE.json (the shared directory)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def address() -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True, text=True).stdout
    return out.split()[3].split("/")[0] if out.split() else ""


def device_round_trip() -> bool:
    import npusim
    import numpy as np

    npusim.init()
    npusim.set_device(0)
    data = np.arange(4096, dtype=np.uint8)
    ptr = npusim.malloc(data.nbytes)
    npusim.memcpy_h2d(ptr, data, None)
    back = np.zeros_like(data)
    npusim.memcpy_d2h(back, ptr, None)
    npusim.free(ptr)
    npusim.reset_device(0)
    npusim.finalize()
    return bool((back == data).all())


def main() -> None:
    import npusim

    sock = os.environ.get("NPUSIM_SOCKET", "")
    status = npusim.daemon_status(sock) if sock else {}
    cli = subprocess.run([str(Path(sys.executable).parent / "npusnap"), "device", "status", "--json"],
                         capture_output=True, text=True)
    record = {
        "slurmd_nodename": os.environ.get("SLURMD_NODENAME"),
        "hostname": socket.gethostname(),
        "address": address(),
        "npusim_socket": sock,
        "daemon_pid": status.get("pid"),
        "cli_status": json.loads(cli.stdout) if cli.returncode == 0 else {"error": cli.stderr.strip()},
        "round_trip": device_round_trip(),
        "restart_count": os.environ.get("SLURM_RESTART_COUNT"),
    }
    line = json.dumps(record)
    if len(sys.argv) > 1:
        out = Path(sys.argv[1])
        out.mkdir(exist_ok=True)
        (out / f"{record['hostname']}.json").write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
