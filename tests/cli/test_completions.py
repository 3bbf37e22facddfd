"""Shell completions: committed, current, and working against the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

GEN = ROOT / "scripts" / "gen_completions.py"
FILES = {"bash": "npusnap.bash", "zsh": "_npusnap", "fish": "npusnap.fish"}


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_NPUSNAP", "NPUSNAP_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_committed_completions_are_current(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GEN), str(tmp_path)], check=True, cwd=ROOT, env=cli_env())
    for name in FILES.values():
        committed = ROOT / "completions" / name
        assert committed.exists(), f"{committed} is missing: run `make completions`"
        assert committed.read_text() == (tmp_path / name).read_text(), \
            f"completions/{name} is stale: run `make completions`"


def test_headers() -> None:
    for shell, name in FILES.items():
        lines = (ROOT / "completions" / name).read_text().splitlines()
        if shell == "zsh":
            assert lines[0] == "#compdef npusnap"               # compinit needs it first
            lines = lines[1:]
        assert "Do not edit" in lines[1] and "make completions" in lines[1]


@pytest.mark.parametrize("shell, check", [("bash", ["bash", "-n"]), ("zsh", ["zsh", "-n"]),
                                          ("fish", ["fish", "--no-execute"])])
def test_scripts_parse(shell: str, check: list[str]) -> None:
    if shutil.which(check[0]) is None:
        pytest.skip(f"{check[0]} is not installed")
    subprocess.run([*check, str(ROOT / "completions" / FILES[shell])], check=True)


def complete(words: str, cword: int, **env: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "npusnap_cli"], capture_output=True, text=True, cwd=ROOT,
                          env=cli_env(_NPUSNAP_COMPLETE="bash_complete", COMP_WORDS=words,
                                      COMP_CWORD=str(cword), **env), timeout=30)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines()]


def test_completes_commands_and_options(tmp_path: Path) -> None:
    assert complete("npusnap chec", 1) == ["check", "checkpoint"]
    assert {"list", "prune", "config"} <= set(complete("npusnap ", 1))
    assert "--keep" in complete("npusnap prune --k", 2)
    assert set(complete("npusnap checkpoint 1 --device ", 4)) == {"auto", "none", "sim", "ascend", "cuda"}
    assert complete("npusnap device st", 2) == ["start", "status", "stop"]
    assert complete("npusnap config ", 2) == ["show"]


def test_a_bad_config_file_does_not_break_completion(tmp_path: Path) -> None:
    (tmp_path / "npusnap").mkdir()
    (tmp_path / "npusnap" / "config.yaml").write_text("nonsense: [\n")
    assert complete("npusnap prune --k", 2, XDG_CONFIG_HOME=str(tmp_path)) == ["--keep"]
