"""What the pipelines tell their caller while they run: typed events, one callback.

The rich progress display (output.Terminal.reporter) draws them; with --json the command's
document carries the warnings among them. A library caller may pass any callable.

The events are NamedTuples: as immutable as frozen dataclasses, and several times cheaper to
define (~0.1 ms against ~0.5 ms each), which every command pays before CRIU's request."""

from __future__ import annotations

import contextlib
import enum
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional, Union

from .. import testhooks
from ..image.format import PhaseTiming


class PhaseStarted(NamedTuple):
    """A pipeline phase began."""

    name: str
    member: Optional[int] = None  # a process set's member (its pid); None: the whole checkpoint

    @property
    def label(self) -> str:
        return self.name if self.member is None else f"{self.name} {self.member}"


class PhaseFinished(NamedTuple):
    """A pipeline phase ended: how long it took and the bytes it moved."""

    name: str
    seconds: float
    bytes: int
    member: Optional[int] = None

    @property
    def label(self) -> str:
        return self.name if self.member is None else f"{self.name} {self.member}"


class BytesExpected(NamedTuple):
    """The running phase fills `directory` with about `total` bytes (0: unknown): a display
    follows the directory's size against it."""

    phase: str
    directory: Path
    total: int
    member: Optional[int] = None

    @property
    def label(self) -> str:
        return self.phase if self.member is None else f"{self.phase} {self.member}"


class Level(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"


class Message(NamedTuple):
    """A line for the person (or the --json document's warnings)."""

    level: Level
    text: str


Event = Union[PhaseStarted, PhaseFinished, BytesExpected, Message]
Progress = Callable[[Event], None]


def quiet(event: Event) -> None:
    pass


def warn(progress: Progress, text: str) -> None:
    progress(Message(Level.WARNING, text))


def info(progress: Progress, text: str) -> None:
    progress(Message(Level.INFO, text))


class Phases:
    """Times each phase, announces its start and end, and keeps the timings for the manifest.
    A set member's phases carry its pid, in the events and in the test hooks' points (NAME@PID)."""

    def __init__(self, progress: Progress, member: Optional[int] = None) -> None:
        self.progress = progress
        self.member = member
        self.timings: list[PhaseTiming] = []

    def _hooks(self, point: str) -> None:
        if self.member is not None:
            point = f"{point}@{self.member}"
        testhooks.pause(point)
        testhooks.fail(point)

    @contextlib.contextmanager
    def __call__(self, name: str, nbytes: int = 0) -> Iterator[PhaseTiming]:
        self._hooks(f"before:{name}")
        self.progress(PhaseStarted(name, self.member))
        t = PhaseTiming(name, 0.0, nbytes)
        start = time.monotonic()
        yield t
        t.seconds = round(time.monotonic() - start, 6)
        self.timings.append(t)
        self.progress(PhaseFinished(name, t.seconds, t.bytes, self.member))
        self._hooks(f"after:{name}")
