"""Every numeric option, its environment variable and its config key refuse nan, inf and
out-of-range values with one line: exit 2 from a flag or variable, 14 from a file.
Nothing runs: pid 1 would be refused later (exit 13), so exit 2 proves the option was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npusnap_cli.cli import main
from npusnap_cli.errors import ConfigProblem

BAD = ["nan", "NaN", "inf", "-inf", "1e308", "1e999", "-1", "abc"]

# (command words before the option, the option, words after)
OPTIONS = [
    (["checkpoint", "1", "-D", "/nonexistent/ck"], "--lock-timeout", []),
    (["checkpoint", "1", "-D", "/nonexistent/ck"], "--lease", []),
    (["checkpoint", "1", "-D", "/nonexistent/ck"], "--criu-timeout", []),
    (["lock", "1"], "--timeout", []),
    (["prune", "/"], "--keep", []),
    (["demo"], "--steps", []),
    (["demo"], "--checkpoint-at", []),
    (["device", "start", "--socket", "/nonexistent/sock"], "--devices", []),
    (["device", "start", "--socket", "/nonexistent/sock"], "--memory", []),
]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    _, err = capsys.readouterr()
    return int(exc.value.code or 0), err


def _bad_for(option: str) -> list[str]:
    # -1 and 1e308 are fine sizes' spellings of nothing: "-1" is not positive, "1e308" overflows.
    return [v for v in BAD if not (option == "--memory" and v == "abc")] + (["2.5"] if option in (
        "--keep", "--steps", "--checkpoint-at", "--devices") else []) + (["nanG", "1e308G"] if option == "--memory"
                                                                      else [])


@pytest.mark.parametrize(("before", "option", "after"), OPTIONS, ids=[o[1] + "-" + o[0][0] for o in OPTIONS])
def test_flags_refuse_non_finite_and_out_of_range(capsys: pytest.CaptureFixture[str], before: list[str],
                                                  option: str, after: list[str]) -> None:
    for value in _bad_for(option):
        rc, err = run(capsys, *before, f"{option}={value}", *after)
        assert rc == 2, (option, value, err)
        lines = [line for line in err.splitlines() if line.startswith("Error:")]
        assert len(lines) == 1 and option in lines[0], (option, value, err)
        assert "Traceback" not in err and "internal error" not in err


def test_environment_variable_is_checked_like_the_flag(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("nan", "inf", "1e308"):
        monkeypatch.setenv("NPUSNAP_CHECKPOINT_LOCK_TIMEOUT", value)
        rc, err = run(capsys, "checkpoint", "1", "-D", "/nonexistent/ck")
        assert rc == 2 and "lock-timeout" in err and "internal error" not in err, (value, err)


@pytest.mark.parametrize(("section", "key", "value"), [
    ("checkpoint", "lock_timeout", ".nan"), ("checkpoint", "lease", ".inf"),
    ("checkpoint", "criu_timeout", "1e308"), ("checkpoint", "lease", "-.inf"),
    ("prune", "keep", ".inf"), ("prune", "keep", "2.5"), ("prune", "keep", "true"),
    ("lock", "timeout", ".nan"),
])
def test_config_values_are_checked_like_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              section: str, key: str, value: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"{section}:\n  {key}: {value}\n")
    rc, err = run(capsys, "--config", str(cfg), "config", "show")
    assert rc == ConfigProblem.exit_code, err
    assert len(err.strip().splitlines()) == 1 and f"{section}.{key}" in err and str(cfg) in err


def test_good_values_still_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("checkpoint:\n  lock_timeout: 120\n  lease: 2.5\nprune:\n  keep: 3.0\n"
                   "device:\n  start: {devices: 4, memory: 8G}\n")
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(cfg), "config", "show", "--json"])
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    values = {s["key"]: s["value"] for s in json.loads(out)["settings"]}
    assert values["checkpoint.lock_timeout"] == 120.0 and values["checkpoint.lease"] == 2.5
    assert values["prune.keep"] == 3 and values["device.start.devices"] == 4
    assert values["device.start.memory"] == "8G"
