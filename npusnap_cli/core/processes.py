"""The workload's process tree as the pipelines handle it: resume, kill, what CRIU dumped."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from ..errors import UnsupportedTarget
from ..image.format import ProcessEntry
from ..platform.procfs import Target, proc_stat, process_tree, wait_gone


def resident_bytes(pids: list[int]) -> int:
    """What CRIU will write, about: the tree's resident memory (for progress only)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            total += int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) << 10
    return total


def resume_tree(root: int) -> list[int]:
    """SIGCONT root and every descendant that is stopped; returns those resumed."""
    resumed = []
    for p in process_tree(root):
        fields = proc_stat(p.pid)
        if fields and fields[1] in ("T", "t"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                resumed.append(p.pid)
    return resumed


def resume(root: int, pids: list[int]) -> None:
    """Resume what CRIU left stopped: the dumped tree, and any descendant of the root."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    resume_tree(root)


def kill(pids: list[int], reaped: bool = False) -> None:
    """SIGKILL the tree and wait (bounded) until it is dead, so a restore may follow at once;
    with reaped, until its pids are free (our children: a restored tree, adopted as its subreaper)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(pids, timeout=10, zombies_count=reaped)


def kill_tree(root: int, pids: list[int]) -> None:
    """A restored tree, killed and reaped: a multi-threaded leader is a zombie before its
    last thread is gone, and only then can it be reaped; its pids must be free when we return."""
    kill(list(dict.fromkeys([*pids, *(p.pid for p in process_tree(root))])), reaped=True)


def parent(pid: int) -> int:
    fields = proc_stat(pid)
    return int(fields[2]) if fields else 0


def pids_in_use(pids: list[int]) -> list[int]:
    # A zombie still holds its pid; give its parent a moment to reap it.
    return wait_gone(pids, timeout=2, zombies_count=True)


def refuse_device_children(target: Target) -> None:
    """Only the root's device state is locked and backed up: a descendant holding device
    state of its own would be dumped with a live driver connection (or lose its device
    memory). Refused before anything is locked."""
    for p in target.tree()[1:]:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            continue  # gone already, or not ours to read: CRIU says so if it matters
        if "libascendcl" in maps:
            raise UnsupportedTarget(
                f"process {p.pid} ({p.comm}), a descendant of {target.pid}, holds device state of its own; "
                f"npusnap checkpoints the device state of the root process only",
                "checkpoint a tree whose device user is its root (e.g. that process on its own)")


def dumped_entries(dumped: list[tuple[int, int, int]], before: list[ProcessEntry]) -> list[ProcessEntry]:
    """The manifest's process list from CRIU's pstree.img (what the dump holds: (pid, ppid,
    threads), root first), with the root's real parent and each name from before the freeze or /proc."""
    known = {p.pid: p for p in before}
    out: list[ProcessEntry] = []
    for pid, ppid, threads in dumped:
        if pid in known:
            comm = known[pid].comm
            if not out:
                ppid = known[pid].ppid  # pstree gives the root a ppid of 0 (outside the dump)
        else:
            fields = proc_stat(pid)
            comm = fields[0] if fields else ""
        out.append(ProcessEntry(pid=pid, ppid=ppid, comm=comm, threads=threads))
    return out
