"""Documentation generated from or checked against the CLI: the man page, the README's
command reference and exit codes, docs/json.md; and output conventions (--json, NO_COLOR)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import click

from npusnap_cli.cli import COMMANDS, app
from npusnap_cli.errors import EXIT_CODES
from npusnap_cli.image.format import Manifest
from npusnap_cli.image.staging import Staging
from tests.helpers import ROOT

NO_JSON = {"run", "device env"}     # run execs the workload; device env prints shell code


def all_commands() -> dict[str, click.Command]:
    """Every leaf command of the CLI, by its full name ("device start")."""
    out: dict[str, click.Command] = {}

    def walk(ctx: click.Context, cmd: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                if sub.hidden:  # internal (the job's per-node worker): neither in the man page nor documented
                    continue
                walk(click.Context(sub, info_name=name, parent=ctx), sub, (*path, name))
        else:
            out[" ".join(path)] = cmd

    walk(click.Context(app, info_name="npusnap"), app, ())
    return out


def test_man_page_is_current(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_man.py"), str(tmp_path / "npusnap.1")],
                   check=True, cwd=ROOT, env=env)
    committed = ROOT / "docs" / "npusnap.1"
    assert committed.read_text() == (tmp_path / "npusnap.1").read_text(), \
        "docs/npusnap.1 is stale: run `make man`"
    lines = committed.read_text().splitlines()
    assert "Do not edit" in lines[1] and lines[2].startswith(".TH NPUSNAP 1")
    for name in all_commands():
        assert f'.SS "npusnap {name.replace("-", chr(92) + "-")} ' in committed.read_text(), name


def readme_reference() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Command reference", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for m in re.finditer(r"^- `npusnap ([a-z-]+)((?: [a-z][a-z|-]*)?)", section, re.M):
        subs = m.group(2).strip()
        names |= {f"{m.group(1)} {s}" for s in subs.split("|")} if subs else {m.group(1)}
    return names


def test_readme_command_reference_matches_the_cli() -> None:
    assert readme_reference() == set(all_commands())
    assert set(COMMANDS) == {n.split()[0] for n in all_commands()}


def test_readme_exit_codes_match() -> None:
    rows = re.findall(r"^\| (\d+) \|", (ROOT / "README.md").read_text(), re.M)
    assert {int(r) for r in rows} == set(EXIT_CODES)


def test_every_command_has_json_and_is_documented() -> None:
    doc = (ROOT / "docs" / "json.md").read_text()
    for name, cmd in all_commands().items():
        has_json = any("--json" in p.opts for p in cmd.params if isinstance(p, click.Option))
        assert has_json == (name not in NO_JSON), name
        if has_json:
            assert f"`{name.replace(' ', '-')}`" in doc or f"`{name.split()[0]}`" in doc, name


# ---------------------------------------------------------------- colour


def checkpoint_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    s = Staging(d / "job")
    (s.criu_dir / "x.img").write_bytes(b"x")
    s.commit(Manifest(pid=1, created="2024-01-01T00:00:00+00:00", host="h", kernel="k",
                      npusnap_version="0", criu_version="0", files=s.seal()))
    Staging(d / "half")                                     # incomplete: shown in yellow
    return d


def run_on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal; everything it wrote."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "npusnap_cli", *args], stdin=subprocess.DEVNULL,
                                stdout=slave, stderr=slave, env=env, cwd=ROOT)
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 20)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:                                 # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=20) == 0
        return b"".join(chunks).decode()
    finally:
        os.close(master)


COLOUR_SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colours(text: str) -> set[str]:
    """SGR parameters that set a colour (30-37, 38, 40-47, 48, 90-97, 100-107)."""
    out = set()
    for m in COLOUR_SGR.finditer(text):
        for p in filter(None, m.group(1).split(";")):
            n = int(p)
            if 30 <= n <= 38 or 40 <= n <= 48 or 90 <= n <= 97 or 100 <= n <= 107:
                out.add(p)
    return out


def test_colour_on_a_terminal_and_no_color_honoured(tmp_path: Path) -> None:
    d = checkpoint_dir(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE") and not k.startswith("NPUSNAP")}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="120")
    assert colours(run_on_a_terminal(["list", str(d)], env)), "expected colour on a terminal"
    out = run_on_a_terminal(["list", str(d)], {**env, "NO_COLOR": "1"})
    assert "job" in out and "incomplete" in out and not colours(out)


def test_no_escape_codes_when_not_a_terminal(tmp_path: Path) -> None:
    d = checkpoint_dir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm-256color")
    for args in (["list", str(d)], ["prune", str(d), "--keep", "5"], ["config", "show"]):
        proc = subprocess.run([sys.executable, "-m", "npusnap_cli", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b[" not in proc.stdout + proc.stderr, args
