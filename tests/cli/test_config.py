"""Configuration: YAML files, NPUSNAP_* variables and flags, in that order; `config show`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from npusnap_cli import config as cfgmod
from npusnap_cli.cli import main
from tests.helpers import ROOT


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No real /etc or ~ config, and no NPUSNAP_* variables from the caller."""
    for name in list(os.environ):
        if name.startswith("NPUSNAP_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(cfgmod, "SYSTEM_CONFIG", tmp_path / "etc" / "config.yaml")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def settings(capsys: pytest.CaptureFixture[str], *args: object) -> dict[str, dict[str, Any]]:
    rc, out, err = run(capsys, *args, "config", "show", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["kind"] == "config"
    return {s["key"]: s for s in doc["settings"]}


def test_defaults_when_no_file(capsys: pytest.CaptureFixture[str]) -> None:
    s = settings(capsys)
    assert s["checkpoint.lock_timeout"] == {**s["checkpoint.lock_timeout"], "value": 60.0, "source": "default",
                                            "origin": None, "env": "NPUSNAP_CHECKPOINT_LOCK_TIMEOUT"}
    assert s["check.criu"]["env"] == "NPUSNAP_CRIU"
    assert s["device.start.devices"]["value"] == 2
    assert "checkpoint.json" not in s and "checkpoint.help" not in s


def test_later_sources_win(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    system = write(tmp_path / "etc" / "config.yaml", "checkpoint: {lock_timeout: 10, device: sim}\nlock: {timeout: 5}\n")
    s = settings(capsys)
    assert (s["checkpoint.lock_timeout"]["value"], s["checkpoint.lock_timeout"]["origin"]) == (10, str(system))

    user = write(tmp_path / "xdg" / "npusnap" / "config.yaml", "checkpoint:\n  lock-timeout: 20\n")
    s = settings(capsys)
    assert (s["checkpoint.lock_timeout"]["value"], s["checkpoint.lock_timeout"]["origin"]) == (20, str(user))
    assert (s["checkpoint.device"]["value"], s["checkpoint.device"]["origin"]) == ("sim", str(system))

    explicit = write(tmp_path / "mine.yaml", "checkpoint: {lock_timeout: 30}\nverbose: true\n")
    s = settings(capsys, "--config", explicit)
    assert (s["checkpoint.lock_timeout"]["value"], s["checkpoint.lock_timeout"]["source"]) == (30, "file")
    assert s["checkpoint.lock_timeout"]["origin"] == str(explicit)
    assert s["verbose"]["value"] is True and s["verbose"]["origin"] == str(explicit)

    monkeypatch.setenv("NPUSNAP_CONFIG", str(explicit))     # the same file, named by the environment
    assert settings(capsys)["checkpoint.lock_timeout"]["value"] == 30

    monkeypatch.setenv("NPUSNAP_CHECKPOINT_LOCK_TIMEOUT", "40")
    monkeypatch.setenv("NPUSNAP_VERBOSE", "0")
    s = settings(capsys, "--config", explicit)
    assert s["checkpoint.lock_timeout"] == {**s["checkpoint.lock_timeout"], "value": 40.0, "source": "env",
                                            "origin": "NPUSNAP_CHECKPOINT_LOCK_TIMEOUT"}
    assert s["verbose"]["value"] is False and s["verbose"]["source"] == "env"
    assert s["lock.timeout"]["value"] == 5                  # untouched layers still show through

    s = settings(capsys, "--config", explicit, "-v")
    assert s["verbose"]["value"] is True and s["verbose"]["source"] == "flag"


def test_global_criu_key_reaches_every_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "criu: /opt/criu/sbin/criu\nrestore: {criu: /other/criu}\n")
    s = settings(capsys, "--config", f)
    for key in ("check.criu", "checkpoint.criu", "dump.criu"):
        assert (s[key]["value"], s[key]["source"], s[key]["origin"]) == ("/opt/criu/sbin/criu", "file", str(f))
    assert s["restore.criu"]["value"] == "/other/criu"      # a command's own key beats the global one


def test_config_reaches_the_command_and_flags_beat_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake = write(tmp_path / "criu", "#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    f = write(tmp_path / "c.yaml", f"criu: {fake}\n")
    rc, out, err = run(capsys, "--config", f, "check", "--json")
    assert rc == 6 and str(fake) in json.dumps(json.loads(out)["checks"])
    rc, out, _ = run(capsys, "--config", f, "check", "--json", "--criu", tmp_path / "nope")
    assert str(fake) not in out and str(tmp_path / "nope") in out


@pytest.mark.parametrize("text, words", [
    ("chekpoint: {lock_timeout: 1}\n", ["chekpoint", "unknown key at the top level", "did you mean 'checkpoint'"]),
    ("checkpoint: {lock_timout: 1}\n", ["checkpoint.lock_timout", "unknown key", "checkpoint.lock_timeout"]),
    ("checkpoint: {lock_timeout: 0}\n", ["checkpoint.lock_timeout", "0"]),
    ("checkpoint: {lock_timeout: soon}\n", ["checkpoint.lock_timeout", "soon"]),
    ("checkpoint: {device: tpu}\n", ["checkpoint.device", "tpu"]),
    ("checkpoint: 5\n", ["checkpoint", "expected a mapping"]),
    ("device: {start: {devices: 99}}\n", ["device.start.devices", "99"]),
    ("criu: [a, b]\n", ["criu", "expected a path"]),
    ("- a\n- b\n", ["top level must be a mapping"]),
    ("checkpoint: {device: sim\n", ["not valid YAML"]),
    ("checkpoint: {device: sim}\ncheckpoint: {device: none}\n", [":2", "'checkpoint' appears twice"]),
])
def test_bad_config_is_one_line_naming_file_and_key(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    text: str, words: list[str]) -> None:
    f = write(tmp_path / "xdg" / "npusnap" / "config.yaml", text)
    rc, out, err = run(capsys, "verify", tmp_path)
    assert rc == 14, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"npusnap: error: {f}")
    for w in words:
        assert w in lines[0]
    assert out == ""


def test_missing_explicit_config_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "--config", tmp_path / "nope.yaml", "config", "show")
    assert rc == 2 and "nope.yaml" in err


def test_empty_file_and_null_values_are_fine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    write(tmp_path / "etc" / "config.yaml", "")
    write(tmp_path / "xdg" / "npusnap" / "config.yaml", "checkpoint:\n  lock_timeout:\n")
    assert settings(capsys)["checkpoint.lock_timeout"]["source"] == "default"


def test_show_human(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = write(tmp_path / "c.yaml", "checkpoint: {device: sim}\n")
    rc, out, _ = run(capsys, "--config", f, "config", "show")
    assert rc == 0
    assert "checkpoint.device" in out and "sim" in out and str(f) in out.replace("\n", "")


def test_help_stays_light_without_a_config_file(tmp_path: Path) -> None:
    code = ("import sys; from npusnap_cli.cli import main\n"
            "for argv in (['--help'], ['verify', '--help']):\n"
            "    try: main(argv)\n    except SystemExit: pass\n"
            "print('YAML=' + str('yaml' in sys.modules))")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=ROOT).stdout
    has_system = cfgmod.SYSTEM_CONFIG.exists()
    assert out.strip().endswith("YAML=False") or has_system
