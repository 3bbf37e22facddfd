"""The undo stack of a pipeline: every step pushes the undo of what it is about to do before
doing it; on any failure, timeout or Ctrl-C the undos run newest first; the commit forgets them."""

from __future__ import annotations

from typing import Callable


class UndoStack:
    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._undos: list[tuple[str, Callable[[], object]]] = []

    def push(self, what: str, undo: Callable[[], object]) -> None:
        self._undos.append((what, undo))

    @property
    def names(self) -> list[str]:
        """What would be undone, oldest first."""
        return [what for what, _ in self._undos]

    def rollback(self) -> None:
        """Run every undo, newest first. One that fails is reported and the rest still run:
        a failed undo must not strand the others."""
        while self._undos:
            what, undo = self._undos.pop()
            try:
                undo()
            except Exception as e:
                self._warn(f"rollback: {what} failed: {e}")

    def keep_only(self, *names: str) -> None:
        """Forget every undo not named: what they would undo is already undone another way (a
        job's ranks that ran on before the commit, core/processset.py)."""
        self._undos = [(what, undo) for what, undo in self._undos if what in names]

    def forget(self) -> None:
        """Committed: nothing is undone any more."""
        self._undos.clear()
