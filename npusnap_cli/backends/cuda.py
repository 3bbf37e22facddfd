"""The cuda backend: every CUDA process of a tree, driven by pid from outside through NVIDIA's
cuCheckpointProcess* API (platform/cuda.py). The driver stages device memory in each process's
own memory (CRIU dumps it), so backup writes no files of its own.

States: CUDA's CHECKPOINTED is BACKED_UP; processes of one tree in different states are MIXED;
FAILED is never passed on as a state: it raises DeviceFailed with what to do."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, ContextManager, Optional, Sequence

from ..errors import DeviceFailed, EnvironmentProblem, NpusnapError, WrongState
from ..image.format import DeviceState, FileEntry
from ..platform.cuda import (
    CHECKPOINTED,
    FAILED,
    FAILED_HINT,
    LOCKED,
    RUNNING,
    STATE_NAMES,
    CudaError,
    Driver,
    _nvml_gpus,
    cuda_error,
    find_cuda_pids,
    validate_device_map,
)
from ..platform.procfs import process_tree
from .base import BackendName, DataPath, State

PIPELINE_STATE = {RUNNING: State.RUNNING, LOCKED: State.LOCKED, CHECKPOINTED: State.BACKED_UP}


class CudaBackend:
    """Every CUDA process of a tree, driven through the by-pid API."""

    name = BackendName.CUDA
    method = DataPath.CUDA_DRIVER

    def __init__(self, root: int, driver: Driver, pids: list[int],
                 device_map: Optional[dict[str, str]] = None) -> None:
        self.root = root
        self.driver = driver
        self.pids = pids
        self.device_map = device_map or {}
        self._gpus: Optional[list[str]] = None

    # -- construction
    @classmethod
    def for_checkpoint(cls, root: int, driver: Optional[Driver] = None) -> "CudaBackend":
        driver = driver or Driver.load()
        try:
            driver.init()
            if not driver.supports_checkpoint():
                raise EnvironmentProblem(
                    f"the NVIDIA driver ({driver.version_text()}) cannot checkpoint processes",
                    "checkpointing needs driver r555 or newer (r570+ for lock timeouts)")
        except CudaError as e:
            raise cuda_error(e, "initializing the CUDA driver") from e
        why: list[str] = []
        pids = find_cuda_pids(root, driver, why)
        if not pids:
            raise WrongState(f"no process in the tree of {root} holds a CUDA context"
                             + (f" ({'; '.join(why)})" if why else ""),
                             "use --device none to checkpoint without GPU state")
        backend = cls(root, driver, pids)
        backend._refuse_failed()
        return backend

    @classmethod
    def for_restore(cls, root: int, device: DeviceState, device_map: Optional[dict[str, str]] = None,
                    driver: Optional[Driver] = None) -> "CudaBackend":
        """After CRIU restore: the restored tree's processes the driver reports CHECKPOINTED."""
        driver = driver or Driver.load()
        try:
            driver.init()
        except CudaError as e:
            raise cuda_error(e, "initializing the CUDA driver") from e
        pids = []
        for p in process_tree(root):
            try:
                if driver.state(p.pid) in (CHECKPOINTED, FAILED):
                    pids.append(p.pid)
            except CudaError:
                continue
        if not pids:
            raise DeviceFailed(f"no restored process of {root} is in the CUDA CHECKPOINTED state",
                               "the checkpoint may not hold GPU state; see `npusnap inspect DIR`")
        backend = cls(root, driver, pids, device_map)
        backend._gpus = list(device.gpus)
        backend._refuse_failed()
        return backend

    # -- helpers
    def _states(self) -> dict[int, int]:
        out = {}
        for pid in self.pids:
            try:
                out[pid] = self.driver.state(pid)
            except CudaError as e:
                raise cuda_error(e, f"asking the CUDA state of process {pid}") from e
        return out

    def _refuse_failed(self) -> None:
        failed = [pid for pid, s in self._states().items() if s == FAILED]
        if failed:
            raise DeviceFailed(f"the CUDA driver reports process {failed[0]} as FAILED "
                               "(an earlier checkpoint or restore went wrong)", FAILED_HINT)

    def _each(self, what: str, fn: Any, pids: list[int], undo: Any = None) -> list[int]:
        """fn(pid) for each pid; on a failure undo(pid) the ones done (newest first) and raise."""
        done: list[int] = []
        for pid in pids:
            try:
                fn(pid)
            except CudaError as e:
                err = cuda_error(e, f"CUDA {what} of process {pid}", self.driver, pid)
                for d in reversed(done):
                    if undo is not None:
                        try:
                            undo(d)
                        except CudaError:
                            pass
                raise err from e
            done.append(pid)
        return done

    # -- the backend interface
    def state(self) -> State:
        states = self._states()
        if FAILED in states.values():
            self._refuse_failed()
        names = {PIPELINE_STATE.get(s) for s in states.values()}
        if len(names) == 1 and None not in names:
            return names.pop()  # type: ignore[return-value]
        detail = ", ".join(f"{p}:{STATE_NAMES.get(s, s)}" for p, s in sorted(states.items()))
        raise WrongState(f"the CUDA processes of {self.root} are not in one phase ({detail})",
                         "wait for the driver to finish its current step, then retry")

    def describe(self) -> DeviceState:
        if self._gpus is None:
            try:
                visible = self.driver.gpus()
            except CudaError as e:
                raise cuda_error(e, "listing the GPUs") from e
            used = _nvml_gpus(self.pids)
            self._gpus = [g for g in visible if used is None or g in used]
            self._ordinals = [i for i, g in enumerate(visible) if g in self._gpus]
        return DeviceState(
            backend=self.name.value,
            devices=list(getattr(self, "_ordinals", [])),
            gpus=list(self._gpus),
            method=self.method.value,  # the driver stages device memory in the process; CRIU dumps it
            runtime=f"{self.driver.path} ({self.driver.version_text()})",
        )

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        # The driver has no lease: a CLI that dies leaves the tree locked (`npusnap recover` undoes it).
        deadline = time.monotonic() + timeout

        def one(pid: int) -> None:
            left_ms = int(max(0.001, deadline - time.monotonic()) * 1000)
            self.driver.lock(pid, left_ms)

        self._each("lock", one, self.pids, self.driver.unlock)

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        self.describe()  # the GPUs are known only while the contexts exist
        self._each("checkpoint", self.driver.checkpoint, self.pids, lambda pid: self.driver.restore(pid))
        return []

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        pairs = self._pairs()
        self._each("restore", lambda pid: self.driver.restore(pid, pairs), self.pids)

    def unlock(self) -> None:
        self._each("unlock", self.driver.unlock, self.pids)

    def release(self) -> None:
        pass

    def back_to_running(self) -> None:
        """Rollback: each process back to RUNNING from wherever lock/checkpoint left it."""
        first: Optional[NpusnapError] = None
        for pid in self.pids:
            try:
                s = self.driver.state(pid)
                if s == CHECKPOINTED:
                    self.driver.restore(pid)
                    s = LOCKED
                if s == LOCKED:
                    self.driver.unlock(pid)
            except CudaError as e:
                first = first or cuda_error(e, f"CUDA rollback of process {pid}", self.driver, pid)
        if first is not None:
            raise first

    def _pairs(self) -> dict[str, str]:
        if not self.device_map:
            return {}
        validate_device_map(self._gpus or [], self.device_map)
        return dict(self.device_map)

    def fence(self) -> None:
        pass  # the driver has no lease

    def frozen_by_criu(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def adopt_lease(self, lease: float) -> None:
        pass

    def finish_after_commit(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        self.restore(device_dir, files)
        self.unlock()
