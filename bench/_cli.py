"""Run the npusnap CLI exactly as its console script does, and write the peak memory of
npusnap itself and of its direct children (criu swrk, the guardian) to a JSON file.

    python bench/_cli.py MEMORY.json checkpoint PID -D DIR ...

Why not getrusage: subprocess starts children with vfork, and ru_maxrss survives exec,
so a child's ru_maxrss starts at its parent's high-water mark (the benchmark's own
buffers). VmHWM belongs to the address space exec creates, so it is the process's own.
Children are polled (every 5 ms) for the same reason; grandchildren are not counted
(during a restore they are the restored workload, not npusnap's overhead), nor the pids
named in NPUSNAP_BENCH_WORKLOAD: a restored root that npusnap, a subreaper, adopts once
`criu swrk` exits is its child then, but it is the workload, not overhead."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


def _vm(pid: int | str, key: str = "VmHWM") -> tuple[str, int]:
    """(comm, value in bytes) from /proc/PID/status; ('', 0) once gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "", 0
    comm, value = "", 0
    for line in text.splitlines():
        if line.startswith("Name:"):
            comm = line.split(None, 1)[1] if len(line.split()) > 1 else ""
        elif line.startswith(key + ":"):
            value = int(line.split()[1]) * 1024
    return comm, value


class ChildWatch(threading.Thread):
    def __init__(self, ignore: set[int]) -> None:
        super().__init__(daemon=True)
        self.ignore = ignore
        self.peaks: dict[int, tuple[str, int]] = {}
        self.stop = threading.Event()

    def _children(self) -> set[int]:
        kids: set[int] = set()
        try:
            for task in os.listdir("/proc/self/task"):
                try:
                    kids.update(int(p) for p in Path(f"/proc/self/task/{task}/children").read_text().split())
                except OSError:
                    pass
        except OSError:
            pass
        return kids - self.ignore

    def run(self) -> None:
        while not self.stop.wait(0.005):
            for pid in self._children():
                comm, hwm = _vm(pid)
                if hwm:
                    old = self.peaks.get(pid, (comm, 0))
                    self.peaks[pid] = (comm or old[0], max(old[1], hwm))


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    code: int | str | None = 0
    workload = os.environ.pop("NPUSNAP_BENCH_WORKLOAD", "")
    watch = ChildWatch({int(p) for p in workload.split(",") if p.strip().isdigit()})
    watch.start()
    try:
        from npusnap_cli.platform import criustart

        criustart.start(args)  # as npusnap_cli/__init__.py does for the `npusnap` command
        from npusnap_cli.cli import main as cli_main

        cli_main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, (int, str)) or e.code is None else 1
    finally:
        watch.stop.set()
        watch.join()
        criu = [v for c, v in watch.peaks.values() if c.startswith("criu")]
        other = [v for c, v in watch.peaks.values() if not c.startswith("criu")]
        with open(out, "w") as f:
            json.dump({"self_hwm": _vm("self")[1], "criu_hwm": max(criu, default=0),
                       "other_children_hwm": sum(other),
                       "children": {str(p): list(v) for p, v in watch.peaks.items()}}, f)
    from npusnap_cli.cli import exit_now

    exit_now(code)  # as the real CLI ends: without the interpreter's finalization


if __name__ == "__main__":
    main()
