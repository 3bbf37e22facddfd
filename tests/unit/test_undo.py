"""The undo stack: newest first, every undo runs even when one fails, the commit forgets them."""

from __future__ import annotations

from npusnap_cli.core.undo import UndoStack


def test_undos_run_newest_first_and_a_failure_strands_none() -> None:
    done: list[str] = []
    warnings: list[str] = []
    stack = UndoStack(warnings.append)
    stack.push("first", lambda: done.append("first"))
    stack.push("broken", lambda: 1 / 0)
    stack.push("last", lambda: done.append("last"))
    assert stack.names == ["first", "broken", "last"]
    stack.rollback()
    assert done == ["last", "first"]
    assert warnings == ["rollback: broken failed: division by zero"]
    assert stack.names == []


def test_after_the_commit_nothing_is_undone() -> None:
    done: list[str] = []
    stack = UndoStack(lambda m: None)
    stack.push("x", lambda: done.append("x"))
    stack.forget()
    stack.rollback()
    assert done == []


def test_keep_only_forgets_the_undos_not_named() -> None:
    done: list[str] = []
    stack = UndoStack(lambda m: None)
    for what in ("cleanup", "device rollback", "resume"):
        stack.push(what, lambda what=what: done.append(what))
    stack.keep_only("cleanup")
    assert stack.names == ["cleanup"]
    stack.rollback()
    assert done == ["cleanup"]
