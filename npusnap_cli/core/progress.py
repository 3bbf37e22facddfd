"""What the pipelines tell their caller while they run: typed events, one callback.

The rich progress display (output.Terminal.reporter) draws them; with --json the command's
document carries the warnings among them. A library caller may pass any callable."""

from __future__ import annotations

import contextlib
import enum
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Union

from .. import testhooks
from ..image.format import PhaseTiming


@dataclass(frozen=True)
class PhaseStarted:
    name: str


@dataclass(frozen=True)
class PhaseFinished:
    name: str
    seconds: float
    bytes: int


@dataclass(frozen=True)
class BytesExpected:
    """The running phase fills `directory` with about `total` bytes (0: unknown): a display
    follows the directory's size against it."""

    phase: str
    directory: Path
    total: int


class Level(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"


@dataclass(frozen=True)
class Message:
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
    """Times each phase, announces its start and end, and keeps the timings for the manifest."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.timings: list[PhaseTiming] = []

    @contextlib.contextmanager
    def __call__(self, name: str, nbytes: int = 0) -> Iterator[PhaseTiming]:
        testhooks.pause(f"before:{name}")
        self.progress(PhaseStarted(name))
        t = PhaseTiming(name, 0.0, nbytes)
        start = time.monotonic()
        yield t
        t.seconds = round(time.monotonic() - start, 6)
        self.timings.append(t)
        self.progress(PhaseFinished(name, t.seconds, t.bytes))
        testhooks.pause(f"after:{name}")
