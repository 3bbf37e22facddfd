"""The operator examples only use commands and options npusnap has: every `npusnap CMD
--opt` in examples/runbook.md and in the example scripts is checked against
`npusnap CMD --help`; the scripts parse (bash -n)."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from npusnap_cli.cli import app, main

from .support import EXAMPLES, PERIODIC, SBATCH, SLURM_LIB

RUNBOOK = EXAMPLES / "runbook.md"
SCRIPTS = (SLURM_LIB, SBATCH, PERIODIC)
# `npusnap SUB [SUB2] ...` as written in docs, or `"$NPUSNAP" SUB ...` in the scripts.
# Only in command position (a line's start, after ; & | or $( ), not in messages.
CALL = re.compile(r'(?:^|[;&|]|\$\()\s*(?:npusnap|"\$NPUSNAP"|"\$npusnap")\s+([a-z][a-z-]*)'
                  r'(?:\s+(start|stop|status|env|show))?([^`|;&\n]*)', re.M)
RUNBOOK_PHASES = {"status", "lock", "backup", "dump", "restore", "device-restore", "unlock", "recover",
                  "verify", "inspect"}


@lru_cache(maxsize=None)
def help_text(*command: str) -> str:
    r = CliRunner().invoke(app, [*command, "--help"])
    assert r.exit_code == 0, f"`npusnap {' '.join(command)} --help` exited {r.exit_code}: {r.output}"
    return r.output


def code_of(path: Path) -> str:
    """What is meant to be run: a Markdown file's code (fenced blocks and `spans`), a
    script's lines without its comments."""
    text = path.read_text().replace("\\\n", " ")
    if path.suffix == ".md":
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
        return "\n".join([*blocks, *spans])
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def uncomment(text: str) -> str:
    return "\n".join(re.sub(r"\s#\s.*$", "", line) for line in text.splitlines())


def calls(path: Path) -> list[tuple[tuple[str, ...], list[str], str]]:
    found = []
    for m in CALL.finditer(uncomment(code_of(path))):
        sub, sub2, rest = m.group(1), m.group(2), m.group(3)
        if sub in ("run",):                         # `npusnap run -- CMD`: options after -- are CMD's
            rest = rest.split(" -- ")[0]
        command = (sub, sub2) if sub == "device" or (sub == "config" and sub2) else (sub,)
        found.append((command, re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest), m.group(0).strip()))
    return found


@pytest.mark.parametrize("path", [RUNBOOK, *SCRIPTS], ids=lambda p: p.name)
def test_every_command_and_option_exists(path: Path) -> None:
    found = calls(path)
    assert found, f"no npusnap command found in {path}"
    for command, options, text in found:
        usage = help_text(*command)
        for opt in options:
            assert re.search(rf"(?<![\w-]){re.escape(opt)}\b", usage), \
                f"{path.name}: `{text}` uses {opt}, which `npusnap {' '.join(command)}` does not have"


def test_runbook_walks_every_phase() -> None:
    used = {c[0][0] for c in calls(RUNBOOK)}
    assert RUNBOOK_PHASES <= used, RUNBOOK_PHASES - used
    text = RUNBOOK.read_text()
    for needle in ("rsync -a", "0700", "0600", "exit 10", "npusnap recover PID", "in use"):
        assert needle in text, needle


def test_in_process_help_matches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["restore", "--help"])
    assert exc.value.code in (0, None) and "--criu-only" in capsys.readouterr().out


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(path: Path) -> None:
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
