"""restore --lazy: the workload runs before its memory is back. Host pages come from CRIU's
`criu lazy-pages` daemon over userfaultfd, device memory from the npusim daemon's first-touch
and background fill (npusim lazy.h); both check what they hand over (the page images were
verified before the restore, every device chunk against its checksum as it is loaded).

LazyRestore owns what brings the memory in until it is all in: finish() waits for both and says
how it went. Until then the restored tree depends on them: an interrupt is ignored (the restore
committed: the pipeline's Signals stay settled), and should the page server fail, the tree is
killed (a process whose pages can no longer come would run on zero pages); a device chunk that
fails its checksum fails the workload's access with ACL_ERROR_RT_DEVICE_MEM_ERROR and is
reported, and the workload decides."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ImageInvalid, Interrupted
from ..platform.criu import LazyPages
from ..platform.procfs import process_exists
from . import processes

POLL_S = 0.5  # one question to the daemon at a time, each waiting up to this for the fill's end
MIN_WAIT_S = 120.0  # the least time allowed for all memory to come in; more per byte (below)
BYTES_PER_S = 50 << 20  # the slowest fill we wait for on a loaded machine before giving up


@dataclass
class LazyOutcome:
    """How a lazy restore's background transfer ended."""

    seconds: float
    pages_status: Optional[int] = None  # `criu lazy-pages`'s exit status (None: no lazy host pages)
    device: dict[str, object] = field(default_factory=dict)  # the daemon's last lazy_status
    workload_exited: bool = False  # it ended before all its memory was in: nothing more to bring
    problems: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.problems)


class LazyRestore:
    def __init__(self, root_pid: int, pids: list[int], pages: Optional[LazyPages], device_socket: Optional[str],
                 total_bytes: int) -> None:
        self.root = root_pid
        self.pids = pids
        self.pages = pages
        self.device_socket = device_socket  # the npusim daemon filling the device memory (None: none lazy)
        self.deadline_s = MIN_WAIT_S + total_bytes / BYTES_PER_S
        self.started = time.monotonic()

    def kill(self) -> None:
        """The restore is undone: the tree, then the page server (which then has no one to serve)."""
        processes.kill_tree(self.root, list(dict.fromkeys([self.root, *self.pids])))
        if self.pages is not None:
            self.pages.kill()

    def finish(self) -> LazyOutcome:
        """Waits until every page and device chunk is in (or the workload is gone). A page server
        that failed or hangs kills the tree (ImageInvalid), as would an interrupt that got through."""
        out = LazyOutcome(0.0)
        deadline = self.started + self.deadline_s
        try:
            if self.pages is not None:
                out.pages_status = self.pages.finish(max(0.0, deadline - time.monotonic()))
                alive = process_exists(self.root, zombies_count=False)
                if out.pages_status is None or (out.pages_status != 0 and alive):
                    self.kill()
                    what = "still serving" if out.pages_status is None else f"exit status {out.pages_status}"
                    raise ImageInvalid(f"CRIU's lazy-pages daemon did not bring every page of process {self.root} "
                                       f"back ({what}); the restored process was killed",
                                       f"see {self.pages.log}; the checkpoint is unchanged: restore it again")
                out.workload_exited = not alive
            if self.device_socket is not None:
                out.device = self._device(deadline)
        except (KeyboardInterrupt, Interrupted):
            self.kill()
            raise
        out.seconds = time.monotonic() - self.started
        state = out.device.get("state")
        if state == "failed":
            errors = out.device.get("errors") or ["see the npusim daemon's log"]
            out.problems.append(f"the lazy device restore of process {self.root} failed: {errors[0]}")  # type: ignore[index]
        elif state == "cancelled" or (state == "filling" and not process_exists(self.root, zombies_count=False)):
            out.workload_exited = True
        elif state == "filling":
            out.problems.append(f"the lazy device restore of process {self.root} did not finish within "
                                f"{self.deadline_s:.0f} s")
        return out

    def _device(self, deadline: float) -> dict[str, object]:
        from ..platform.simimages import lazy_status

        while True:
            st = lazy_status(self.root, self.device_socket, wait_s=POLL_S)
            if st.get("state") != "filling" or time.monotonic() >= deadline:
                return st
            if not process_exists(self.root, zombies_count=False):
                return st  # the daemon cancels the fill as the session ends
