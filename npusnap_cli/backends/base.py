"""The device backend interface: what the pipeline asks of a device, and the names it uses.

A backend moves one process tree's device state through the phases

    RUNNING --lock--> LOCKED --backup--> BACKED_UP --restore--> LOCKED --unlock--> RUNNING

and undoes whatever part of that happened (back_to_running). The values of `State` are the
agent's (native/agent) and CANN's state names; `DataPath` says where device memory goes, and is
recorded in the manifest as DeviceState.method.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import ContextManager, Optional, Protocol, Sequence

from .._protocol import STATE_BACKED_UP, STATE_LOCKED, STATE_RUNNING
from ..errors import DeviceFailed, WrongState
from ..image.format import DeviceState, FileEntry


class State(str, enum.Enum):
    """A process's device phase, as the agent reports it (CUDA's CHECKPOINTED is BACKED_UP)."""

    RUNNING = STATE_RUNNING  # native/include/npusnap/states.h
    LOCKED = STATE_LOCKED
    BACKED_UP = STATE_BACKED_UP

    @classmethod
    def parse(cls, text: Optional[str]) -> "State":
        """The agent's state name; anything else is a device failure, not a traceback."""
        try:
            return cls(text)
        except ValueError:
            raise DeviceFailed(f"the agent reported an unknown state {text!r}") from None

    def __str__(self) -> str:
        return self.value


class DataPath(str, enum.Enum):
    """Where device memory goes during a checkpoint (the manifest's device.method)."""

    NONE = "none"  # no device state
    IN_PROCESS = "in-process"  # staged in the process's host memory; CRIU writes it (CANN's way)
    DIRECT = "direct"  # npusim's daemon streams it into DIR/device/
    CUDA_DRIVER = "cuda-driver"  # the CUDA driver stages it in the process; CRIU writes it

    def __str__(self) -> str:
        return self.value


class DataPathChoice(str, enum.Enum):
    """--data-path: what the user asks for; the backend decides the DataPath."""

    AUTO = "auto"
    DIRECT = "direct"
    IN_PROCESS = "in-process"

    def __str__(self) -> str:
        return self.value


class BackendName(str, enum.Enum):
    """--device and the manifest's device.backend."""

    AUTO = "auto"  # a request only: found from the process
    NONE = "none"
    SIM = "sim"
    ASCEND = "ascend"
    CUDA = "cuda"

    def __str__(self) -> str:
        return self.value


class Backend(Protocol):
    """One process tree's device side. Every method may raise NpusnapError."""

    name: BackendName
    method: DataPath

    def state(self) -> State: ...

    def describe(self) -> DeviceState:
        """The device section of the manifest."""
        ...

    def lock(self, timeout: float, lease: Optional[float] = None) -> None: ...

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        """Take the device state off the device; returns the image files it wrote
        itself into device_dir (checksummed and fsync'd), if any."""
        ...

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        """Put the device state back (from device_dir's files, for backends that write them)."""
        ...

    def unlock(self) -> None: ...

    def back_to_running(self) -> None:
        """Rollback: undo whatever part of lock and backup happened."""
        ...

    def fence(self) -> None:
        """Before each step: renew the lock's lease now and make sure it is still ours.
        Raises LeaseLost when it ran out (we were stopped or frozen past it)."""
        ...

    def frozen_by_criu(self) -> ContextManager[None]:
        """Around CRIU's dump: fence first; at the end, with the tree frozen, make sure the lease
        had not run out before the freeze (the agent would have taken the workload back, and the
        images would hold it so): raises LeaseLost when it had."""
        ...

    def adopt_lease(self, lease: float) -> None:
        """Restore: take over the lease the restored process's lock still holds, if any."""
        ...

    def release(self) -> None:
        """Stop holding the device lock's lease (the checkpoint is over, one way or another)."""
        ...

    def finish_after_commit(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        """--leave-running after the commit: device restore from the committed images, unlock."""
        ...


def unlock_unless_running(backend: Backend) -> None:
    """The unlock after the device's data is back. Refused because the process runs already is no
    failure: its agent unlocked it when the lease ran out while we were stopped, which it does (and
    npusim's daemon allows) only with the data in place, as ours would have."""
    try:
        backend.unlock()
    except WrongState:
        if backend.state() != State.RUNNING:
            raise
