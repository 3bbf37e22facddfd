"""The none backend: a process without device state; CRIU alone. Every device phase is a no-op."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import ContextManager, Optional, Sequence

from ..image.format import DeviceState, FileEntry
from .base import BackendName, DataPath, State


class NoDevice:
    name = BackendName.NONE
    method = DataPath.NONE

    def state(self) -> State:
        return State.RUNNING

    def describe(self) -> DeviceState:
        return DeviceState()

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        pass

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        return []

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        pass

    def unlock(self) -> None:
        pass

    def back_to_running(self) -> None:
        pass

    def fence(self) -> None:
        pass

    def frozen_by_criu(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def adopt_lease(self, lease: float) -> None:
        pass

    def release(self) -> None:
        pass

    def finish_after_commit(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        pass
