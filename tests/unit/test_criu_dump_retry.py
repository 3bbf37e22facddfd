"""platform/criu.Criu.dump tries again when CRIU failed on a passing moment (a process caught
mid-exit), with the failed attempt's images removed; any other failure is reported at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from npusnap_cli.errors import CriuFailed
from npusnap_cli.platform import criu


class ScriptedDump(criu.Criu):
    """Each attempt writes the log lines given and leaves a stale image behind."""

    def __init__(self, attempts: list[tuple[bool, str]]) -> None:
        self.attempts = attempts
        self.calls = 0

    def _dump_once(self, o: criu.DumpOptions) -> Any:
        assert not any(o.images_dir.iterdir()), "an earlier attempt's images were left for this one"
        ok, log = self.attempts[self.calls]
        self.calls += 1
        (o.images_dir / "core-1.img").write_bytes(b"partial")
        (o.log_dir / "dump.log").write_text(log)
        return SimpleNamespace(success=ok, HasField=lambda name: False)


def _options(tmp_path: Path) -> criu.DumpOptions:
    (tmp_path / "images").mkdir()
    (tmp_path / "logs").mkdir()
    return criu.DumpOptions(pid=1, images_dir=tmp_path / "images", log_dir=tmp_path / "logs")


ZOMBIE = "(00.01) Error (criu/cr-dump.c:1): Zombies with threads are not supported\n"


def test_a_zombie_caught_mid_exit_is_dumped_on_the_next_attempt(tmp_path: Path) -> None:
    c = ScriptedDump([(False, ZOMBIE), (True, "")])
    c.dump(_options(tmp_path))
    assert c.calls == 2


def test_attempts_are_bounded(tmp_path: Path) -> None:
    c = ScriptedDump([(False, ZOMBIE)] * criu.DUMP_ATTEMPTS)
    with pytest.raises(CriuFailed, match="Zombies with threads"):
        c.dump(_options(tmp_path))
    assert c.calls == criu.DUMP_ATTEMPTS


def test_any_other_failure_is_reported_at_once(tmp_path: Path) -> None:
    c = ScriptedDump([(False, "(00.01) Error (criu/files.c:1): Can't dump file 7\n"), (True, "")])
    with pytest.raises(CriuFailed, match="Can't dump file 7"):
        c.dump(_options(tmp_path))
    assert c.calls == 1
