"""Every error path prints one line on stderr and exits with its documented code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from npusnap_cli import cli
from npusnap_cli.cli import main
from npusnap_cli.errors import EXIT_CODES, Interrupted


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("pid, code, words", [
    ("abc", 4, "not a process id"),
    ("0", 4, "not a process id"),
    ("1", 13, "pid 1"),
    ("2", 13, "kernel thread"),
])
def test_bad_pids(capsys: pytest.CaptureFixture[str], tmp_path: Path, pid: str, code: int, words: str) -> None:
    rc, out, err = run(capsys, "checkpoint", pid, "-D", tmp_path / "ck")
    assert rc == code, err
    assert words in one_line(err)
    assert not (tmp_path / "ck").exists()


def test_nonexistent_pid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "checkpoint", dead_pid(), "-D", tmp_path / "ck")
    assert rc == 4 and "no process with pid" in one_line(err)


def test_zombie(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = subprocess.Popen(["true"])
    try:
        import time

        while Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)
        rc, _, err = run(capsys, "checkpoint", p.pid, "-D", tmp_path / "ck")
        assert rc == 4 and "zombie" in one_line(err)
    finally:
        p.wait()


def test_an_import_that_a_pipelines_interrupt_cut_short_reports_the_interrupt(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C in a checkpoint (the pipeline's handler raises Interrupted) landing in an extension
    module's init comes out of the import as ImportError (pybind11's "initialization failed"): the
    interrupt it is (exit 130, one line), not an internal error."""
    def cut_short(**kwargs: object) -> None:
        try:
            raise Interrupted()
        except Interrupted as e:
            raise ImportError("initialization failed") from e

    monkeypatch.setattr(cli.app, "main", cut_short)
    rc, _, err = run(capsys, "status", "1")
    assert rc == 130 and "interrupted" in one_line(err), err


def test_usage_errors_exit_2_as_in_click(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "checkpoint", "123")
    assert rc == 2 and "Missing option" in err
    rc, _, err = run(capsys, "checkpoint", "-5", "-D", "x")
    assert rc == 2 and "No such option" in err


@pytest.mark.parametrize("cmd", ["verify", "restore", "inspect"])
def test_not_a_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path, cmd: str) -> None:
    rc, _, err = run(capsys, cmd, tmp_path)
    assert rc == 8 and "not a checkpoint directory" in one_line(err)
    rc, _, err = run(capsys, cmd, tmp_path / "nope")
    assert rc == 8 and "no such directory" in one_line(err)


def test_future_format_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "manifest.yaml").write_text("format_version: 99\n")
    rc, _, err = run(capsys, "verify", tmp_path)
    assert rc == 8 and "newer than this npusnap" in one_line(err)


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "criu/../../x"])
def test_manifest_paths_that_escape(capsys: pytest.CaptureFixture[str], tmp_path: Path, path: str) -> None:
    from npusnap_cli.image.format import manifest_text

    (tmp_path / "manifest.yaml").write_text(manifest_text({
        "format_version": 1, "pid": 1, "created": "x", "host": "h", "kernel": "k", "npusnap_version": "v",
        "criu_version": "c", "files": [{"path": path, "size": 1, "checksum": "x"}]}))
    rc, _, err = run(capsys, "verify", tmp_path)
    assert rc == 8 and "outside the checkpoint" in one_line(err)


def test_edited_manifest_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from npusnap_cli.image.format import manifest_text

    text = manifest_text({"format_version": 1, "pid": 1, "created": "x", "host": "h", "kernel": "k",
                          "npusnap_version": "v", "criu_version": "c", "files": []})
    (tmp_path / "manifest.yaml").write_text(text)
    assert run(capsys, "verify", tmp_path)[0] == 0
    (tmp_path / "manifest.yaml").write_text(text.replace("pid: 1", "pid: 2"))
    rc, _, err = run(capsys, "verify", tmp_path)
    assert rc == 8 and "edited" in one_line(err)


def test_existing_checkpoint_is_not_overwritten(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "manifest.yaml").write_text("format_version: 1\n")
    rc, _, err = run(capsys, "checkpoint", str(__import__("os").getpid()), "-D", tmp_path / "ck", "--device", "none")
    assert rc == 12 and "already holds a checkpoint" in one_line(err)


def test_help_lists_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for code in EXIT_CODES:
        assert f" {code} " in out.replace("\n", " ") or f"{code:>3}" in out


def test_help_does_not_import_heavy_modules() -> None:
    code = ("import sys; from npusnap_cli.cli import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "heavy = [m for m in ('rich', 'pycriu', 'yaml', 'google.protobuf', 'npusim') if m in sys.modules]\n"
            "print('HEAVY=' + ','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY=\n" in out


def test_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "check", "--json")
    doc = json.loads(out)
    assert doc["kind"] == "check" and doc["schema"] == 1
    assert {c["name"] for c in doc["checks"]} >= {"criu", "kernel", "privileges"}
    assert rc == (0 if doc["ok"] else 6)


def test_check_fails_with_a_fix_when_criu_is_too_old(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake = tmp_path / "criu"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    rc, _, err = run(capsys, "check", "--criu", fake)
    assert rc == 6 and "install-criu" in one_line(err)


class _SigintAfterWrite:
    """A stream that sends this process SIGINT right after each write: a Ctrl-C landing the
    instant an outcome is out."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.written = ""

    def write(self, text: str) -> int:
        self.written += text
        os.kill(os.getpid(), signal.SIGINT)
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


@pytest.mark.parametrize("args, code, stream, words", [
    (["--version"], 0, "stdout", "npusnap, version"),
    (["status", "1"], 13, "stderr", "refusing"),
])
def test_a_ctrl_c_once_the_outcome_is_out_does_not_replace_it(
        monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, stream: str, words: str) -> None:
    # Before, the version went out and the command still exited 130, "rolled back".
    sink = _SigintAfterWrite(getattr(sys, stream))
    monkeypatch.setattr(sys, stream, sink)
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == code, sink.written
    assert words in sink.written and "interrupted" not in sink.written
