"""SIGINT/SIGTERM during a pipeline: an interrupt between steps, held inside critical sections,
ignored while rolling back and once the outcome is settled."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

from ..errors import Interrupted


class Signals:
    """Turns SIGINT/SIGTERM into Interrupted, except inside critical sections
    (a CRIU dump in flight), where the signal is held until the section ends.
    Once rollback starts, further signals are ignored so the undos complete.

    The commit is one point (commit_point): a signal held across it, or arriving
    after it, never undoes committed work; the pipeline finishes and reports what
    happened. Once settled the handlers stay ignoring signals (to the process's
    exit), so nothing after the commit can report "rolled back"."""

    def __init__(self) -> None:
        self.pending = False
        self.depth = 0
        self.rolling_back = False
        self.settled = False
        self._old: dict[int, Any] = {}
        self._depth_lock = threading.Lock()  # a set's members enter critical sections from threads of their own

    def _deeper(self, by: int) -> int:
        with self._depth_lock:
            self.depth += by
            return self.depth

    def _handler(self, signum: int, frame: Any) -> None:
        if self.rolling_back or self.settled or self.depth:
            self.pending = True
            return
        if _starting_a_thread(frame):
            # Raised inside Thread.start(), right after the thread began, the exception makes start()
            # take back the new thread's registration, which the thread then fails to find (Python
            # prints "Exception ignored in thread started by ... KeyError" beside our error line):
            # the signal comes again in a moment, once start() has returned.
            signal.signal(signal.SIGALRM, lambda _s, _f: signal.raise_signal(signum))
            signal.setitimer(signal.ITIMER_REAL, 0.002)
            return
        raise Interrupted()

    def __enter__(self) -> "Signals":
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.settled:
            return  # our handler, settled, keeps ignoring: the outcome is decided
        for s, h in self._old.items():
            signal.signal(s, h)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        self._deeper(1)
        try:
            yield
        finally:
            depth = self._deeper(-1)
        if self.pending and not depth and not self.settled:
            raise Interrupted()

    @contextlib.contextmanager
    def commit_point(self) -> Iterator[None]:
        """Signals wait while the body runs; once it returned, the outcome is settled."""
        self._deeper(1)
        try:
            yield
            self.settled = True
        finally:
            self._deeper(-1)


def _starting_a_thread(frame: Any) -> bool:
    """Whether frame is inside threading.Thread.start (the fsync and member threads start often)."""
    import threading

    start = threading.Thread.start.__code__
    while frame is not None:
        if frame.f_code is start:
            return True
        frame = frame.f_back
    return False
