"""What the pipelines drive, gathered in one object so that tests can put fakes in its place
(tests/unit drive the pipelines with a fake backend and a fake CRIU, without root)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Protocol, Sequence

from ..backends import Backend, BackendName, DataPathChoice
from ..criuopts import CriuOptions
from ..image.format import DeviceState
from ..platform.procfs import Target


class CriuBinaryInfo(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def version_str(self) -> str: ...


class CriuDriver(Protocol):
    """platform.criu.Criu, as the pipelines use it."""

    @property
    def binary(self) -> CriuBinaryInfo: ...

    def dump(self, o: Any) -> None: ...

    def dumped_tree(self, images_dir: Path) -> list[tuple[int, int, int]]: ...

    def restore(self, images_dir: Path, log_dir: Path, shell_job: bool = False, tcp_established: bool = False,
                log_level: int = 4, extra: Optional[CriuOptions] = None,
                started: Optional[Callable[[int], None]] = None, leave_stopped: bool = False,
                lazy_pages: bool = False) -> int: ...

    def lazy_pages(self, images_dir: Path, log_dir: Path) -> Any: ...  # platform.criu.LazyPages, started

    def features(self) -> dict[str, bool]: ...

    def release_network_lock(self, images_dir: Path, method: Optional[str], pids: list[int],
                             warn: Callable[[str], None]) -> None: ...


class GuardianLike(Protocol):
    """core.guardian.Guardian: cleans up after us if we die."""

    def watch(self, pids: list[int]) -> None: ...

    def kill_if_dead(self, pids: list[int]) -> None: ...

    def wait_for_criu(self, pid: int) -> None: ...

    def recover_from(self, device_dir: Path, chain: Sequence[Path] = ()) -> None: ...

    def recover_kept(self, daemon: str, member: Optional[int] = None) -> None: ...

    def meet(self, directory: Path, pids: list[int], owned: bool = True) -> None: ...

    def committing(self, staging: Path, final: Path, kills: bool) -> None: ...

    def restoring(self) -> None: ...

    def remove_after(self, directory: Path) -> None: ...

    def resumed(self) -> None: ...

    def release(self) -> None: ...


class ImagesViewLike(Protocol):
    def enter(self, images_dir: Path, warn: Callable[[str], None]) -> Path: ...


def _criu(path: Optional[str]) -> CriuDriver:
    from ..platform.criu import Criu, find_criu

    return Criu(find_criu(path))


def _select(pid: int, requested: BackendName, maps: str, data_path: DataPathChoice) -> Backend:
    from .. import backends

    return backends.select(pid, requested, maps, data_path)


def _for_restore(pid: int, device: DeviceState, device_map: Optional[dict[str, str]]) -> Backend:
    from .. import backends

    return backends.for_restore(pid, device, device_map)


def _guardian(staging: Optional[Path], pid: int) -> GuardianLike:
    from .guardian import Guardian

    return Guardian(staging, pid)


def _images_view() -> ContextManager[ImagesViewLike]:
    from ..platform.imagesview import ImagesView

    return ImagesView()


def _open_target(pid: int) -> Target:
    from ..platform.procfs import open_target

    return open_target(pid)


def _device_fits(device: DeviceState) -> None:
    from ..backends.capacity import fits

    fits(device)


def _become_subreaper() -> None:
    from ..platform.criu import become_subreaper

    become_subreaper()


@dataclass
class Services:
    """What the pipelines reach outside Python through: the real ones, or a test's fakes."""

    criu: Callable[[Optional[str]], CriuDriver] = _criu
    select_backend: Callable[[int, BackendName, str, DataPathChoice], Backend] = _select
    restore_backend: Callable[[int, DeviceState, Optional[dict[str, str]]], Backend] = _for_restore
    guardian: Callable[[Optional[Path], int], GuardianLike] = _guardian
    images_view: Callable[[], ContextManager[ImagesViewLike]] = _images_view
    open_target: Callable[[int], Target] = _open_target
    device_fits: Callable[[DeviceState], None] = _device_fits  # a restore's device check, before anything starts
    become_subreaper: Callable[[], None] = _become_subreaper


REAL = Services()
