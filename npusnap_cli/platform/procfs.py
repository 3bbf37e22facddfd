"""The process to checkpoint: validated up front, so bad targets fail with one clear line."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import PermissionProblem, TargetNotFound, UnsupportedTarget
from ..image.format import ProcessEntry


@dataclass
class Target:
    """A process to checkpoint, as /proc shows it."""

    pid: int
    command: list[str]
    uid: int

    def tree(self) -> list[ProcessEntry]:
        return process_tree(self.pid)

    def maps(self) -> str:
        try:
            return Path(f"/proc/{self.pid}/maps").read_text()
        except OSError:
            return ""


def parse_pid(value: str) -> int:
    try:
        pid = int(value)
    except ValueError:
        raise TargetNotFound(f"{value!r} is not a process id", "give a numeric pid") from None
    if pid <= 0:
        raise TargetNotFound(f"{pid} is not a process id", "give a positive pid")
    return pid


def _stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    # comm may contain spaces and parentheses: split after the last ')'.
    head, _, rest = raw.rpartition(")")
    return [head.split("(", 1)[1]] + rest.split()


def _raw_stat_fields(name: str) -> list[str]:
    """_stat_fields with plain os calls: a tree scan reads every process's stat."""
    fd = os.open(f"/proc/{name}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        raw = os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)
    head, _, rest = raw.rpartition(")")
    return [head.split("(", 1)[1]] + rest.split()


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat as fields (comm, state, ppid, ...), or [] when the process is gone."""
    try:
        return _stat_fields(pid)
    except (OSError, IndexError):
        return []


def open_target(pid: int) -> Target:
    """Check that pid names a live, user-space process we may checkpoint."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise TargetNotFound(f"no process with pid {pid}") from None
    except PermissionError:
        raise PermissionProblem(f"process {pid} belongs to another user") from None
    if pid == 1:
        raise UnsupportedTarget("refusing to checkpoint pid 1 (init): killing it would take the system down",
                           "checkpoint the workload's own process instead")
    try:
        fields = _stat_fields(pid)
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        raise TargetNotFound(f"process {pid} exited") from None
    except PermissionError:
        raise PermissionProblem(f"cannot read /proc/{pid}") from None
    state = fields[1]
    flags = int(fields[7])
    PF_KTHREAD = 0x00200000
    if flags & PF_KTHREAD:
        raise UnsupportedTarget(f"pid {pid} ({fields[0]}) is a kernel thread; only user processes can be checkpointed")
    if state in ("Z", "X"):
        raise TargetNotFound(f"process {pid} is a zombie (it has exited; its parent has not reaped it)")
    uid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
    if os.geteuid() != 0 and uid != os.geteuid():
        raise PermissionProblem(f"process {pid} belongs to uid {uid}, not to you")
    command = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    return Target(pid, command, uid)


def process_tree(root: int) -> list[ProcessEntry]:
    """root and its descendants, root first, then breadth first (each one's children by pid). From
    the kernel's lists of each thread's children where it keeps them (CONFIG_PROC_CHILDREN): a few
    reads per process of the tree, not one per process on the machine (thousands on a node)."""
    if _HAS_CHILDREN_LISTS:
        return _tree_from_children_lists(root)
    return _tree_from_scan(root)


_HAS_CHILDREN_LISTS = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _tree_from_children_lists(root: int) -> list[ProcessEntry]:
    out: list[ProcessEntry] = []
    todo, seen = [root], set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        try:
            f = _raw_stat_fields(str(pid))
            tasks = os.listdir(f"/proc/{pid}/task")
        except (OSError, IndexError):
            continue  # gone meanwhile
        kids: set[int] = set()
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    kids.update(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                pass  # that thread ended meanwhile
        out.append(ProcessEntry(pid=pid, ppid=int(f[2]), comm=f[0], threads=int(f[18])))
        todo.extend(sorted(kids))
    return out


def _tree_from_scan(root: int) -> list[ProcessEntry]:
    children: dict[int, list[int]] = {}
    info: dict[int, ProcessEntry] = {}
    for name in os.listdir("/proc"):  # every process (no /proc/PID/task/TID/children here): kept lean
        if not name.isdigit():
            continue
        try:
            f = _raw_stat_fields(name)
        except (OSError, IndexError):
            continue
        pid, ppid = int(name), int(f[2])
        info[pid] = ProcessEntry(pid=pid, ppid=ppid, comm=f[0], threads=int(f[18]))
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in info:
            out.append(info[pid])
            todo.extend(sorted(children.get(pid, [])))
    return out


def wait_gone(pids: list[int], timeout: float, zombies_count: bool) -> list[int]:
    """Wait until no pid is alive (or, with zombies_count, even a zombie); return those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if process_exists(p, zombies_count)]
        # A restored process is our child (we are a subreaper): reap it, or its pid stays taken.
        for p in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p, os.WNOHANG)
        if not left or time.monotonic() >= deadline:
            return left
        pause = min(0.01, max(0.0, deadline - time.monotonic()))
        if zombies_count:
            time.sleep(pause)  # a zombie's pidfd is readable already: no wake-up to wait for
        else:
            _until_exit(left[0], pause)


def _until_exit(pid: int, timeout: float) -> None:
    """Sleep up to timeout, woken the instant pid exits (its pidfd turns readable): a killed
    tree is seen dead at once, not at the next 10 ms poll."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    except (AttributeError, OSError):  # no pidfd on this kernel
        time.sleep(timeout)
        return
    try:
        import select

        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def process_exists(pid: int, zombies_count: bool) -> bool:
    fields = proc_stat(pid)
    return bool(fields) and (zombies_count or fields[1] not in ("Z", "X"))
