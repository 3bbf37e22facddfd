"""The typed progress events as the Terminal consumes them: warnings on stderr and, with --json,
in the command's document; phases and byte counts drawn only for a person at a terminal."""

from __future__ import annotations

from pathlib import Path

import pytest

from npusnap_cli.core.progress import BytesExpected, Level, Message, PhaseFinished, Phases, PhaseStarted
from npusnap_cli.output import Terminal


def _events(directory: Path) -> list[object]:
    return [PhaseStarted("dump"), BytesExpected("dump", directory, 1 << 20), PhaseFinished("dump", 0.5, 1 << 20),
            Message(Level.WARNING, "a warning"), Message(Level.INFO, "a note")]


def test_json_mode_keeps_warnings_for_the_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    term = Terminal(json_mode=True)
    with term.reporter() as report:
        for event in _events(tmp_path):
            report(event)  # type: ignore[arg-type]
    assert term.warnings == ["a warning"]
    out, err = capsys.readouterr()
    assert out == "" and "a warning" in err and "a note" not in err  # notes are for people only


def test_without_a_terminal_only_messages_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    term = Terminal()
    with term.reporter() as report:
        for event in _events(tmp_path):
            report(event)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert out == "" and "dump" not in err
    assert "a warning" in err and "a note" in err


def test_phases_announce_start_and_end_with_their_bytes() -> None:
    seen: list[object] = []
    phase = Phases(seen.append)
    with phase("backup") as t:
        t.bytes = 42
    assert seen[0] == PhaseStarted("backup")
    assert isinstance(seen[1], PhaseFinished) and (seen[1].name, seen[1].bytes) == ("backup", 42)
    assert [p.name for p in phase.timings] == ["backup"]
