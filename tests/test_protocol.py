"""The protocols shared by C and Python are defined once, in native/include/npusnap/*.h.

npusnap_cli/_protocol.py is generated from those headers at build time (scripts/gen_protocol.py).
Here the C compiler itself reads the headers (`cc -dM -E` lists the macros, a compiled program
prints their values), independently of the generator's parser, and the generated module must hold
exactly those constants with exactly those values.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Union

import pytest

from npusnap_cli import _protocol

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "native" / "include"
HEADERS = sorted((INCLUDE / "npusnap").glob("*.h"))
GENERATOR = ROOT / "scripts" / "gen_protocol.py"
CC = shutil.which("cc") or shutil.which("gcc")

needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to read the headers with")


def _macro_names() -> list[str]:
    """Every NPUSNAP_* object-like macro the headers define, as the preprocessor sees them."""
    names = set()
    for header in HEADERS:
        out = subprocess.run([str(CC), "-dM", "-E", "-I", str(INCLUDE), str(header)],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.match(r"#define (NPUSNAP_\w+)(\(?)\s*(.*)$", line)
            if not m or (m.group(1).endswith("_H") and not m.group(3)):
                continue  # another macro, or an include guard
            assert not m.group(2), f"{m.group(1)} is function-like: the headers hold constants only"
            names.add(m.group(1))
    return sorted(names)


def _values_from_c(names: list[str], tmp: Path) -> dict[str, Union[int, str]]:
    """The macros' values, printed by a program compiled against the headers."""
    source = ["#include <stdio.h>"] + [f'#include "npusnap/{h.name}"' for h in HEADERS] + [
        'static void s(const char *n, const char *v) { printf("%s\\ts\\t%s\\n", n, v); }',
        'static void i(const char *n, long long v) { printf("%s\\ti\\t%lld\\n", n, v); }',
        "#define SHOW(x) _Generic((x), char *: s, const char *: s, default: i)(#x, (x))",
        "int main(void) {",
        *[f"    SHOW({name});" for name in names],
        "    return 0;",
        "}",
    ]
    (tmp / "show.c").write_text("\n".join(source) + "\n")
    subprocess.run([str(CC), "-std=c11", "-Wall", "-Werror", "-I", str(INCLUDE), "-o", str(tmp / "show"),
                    str(tmp / "show.c")], check=True, capture_output=True, text=True)
    out = subprocess.run([str(tmp / "show")], capture_output=True, text=True, check=True).stdout
    values: dict[str, Union[int, str]] = {}
    for line in out.splitlines():
        name, kind, value = line.split("\t", 2)
        values[name] = int(value) if kind == "i" else value
    return values


def _generated() -> dict[str, object]:
    return {k: v for k, v in vars(_protocol).items() if re.fullmatch(r"[A-Z][A-Z0-9_]*", k)}


@needs_cc
def test_generated_module_matches_the_headers(tmp_path: Path) -> None:
    names = _macro_names()
    assert len(names) > 40, names  # the agent's, the injector's, ctl's, the sockets' and the states
    from_c = {name[len("NPUSNAP_"):]: value for name, value in _values_from_c(names, tmp_path).items()}
    generated = _generated()
    assert sorted(set(from_c) - set(generated)) == [], "in the headers, missing from _protocol.py"
    assert sorted(set(generated) - set(from_c)) == [], "in _protocol.py, not in the headers"
    wrong = {k: (generated[k], from_c[k]) for k in from_c if generated[k] != from_c[k]
             or type(generated[k]) is not type(from_c[k])}
    assert wrong == {}, "(python, C) values differ: rebuild with `make setup`"


def test_the_python_side_uses_the_generated_values() -> None:
    from npusnap_cli import native
    from npusnap_cli.platform import agent

    assert agent.E_STATE == _protocol.AGENT_E_STATE and agent.LOCK_TIMEOUT == _protocol.AGENT_LOCK_TIMEOUT
    assert agent.INJECT_PERMISSION == _protocol.INJECT_PERMISSION
    assert native.agent_socket_name(42) == "\0" + _protocol.AGENT_SOCKET_PREFIX + "42"


def _generate(headers: list[Path], out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), "--out", str(out), *map(str, headers)],
                          capture_output=True, text=True)


def test_a_changed_header_changes_the_generated_value(tmp_path: Path) -> None:
    (tmp_path / "npusnap").mkdir()
    for header in HEADERS:
        text = header.read_text()
        if header.name == "agent.h":
            text, n = re.subn(r"(#define NPUSNAP_AGENT_E_STATE )\(-3\)", r"\1(-33)", text)
            assert n == 1
        if header.name == "states.h":
            text, n = re.subn(r'"LOCKED"', '"HELD"', text)
            assert n == 1
        (tmp_path / "npusnap" / header.name).write_text(text)
    out = tmp_path / "gen.py"
    r = _generate(sorted((tmp_path / "npusnap").glob("*.h")), out)
    assert r.returncode == 0, r.stderr
    namespace: dict[str, object] = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)
    assert namespace["AGENT_E_STATE"] == -33 and namespace["STATE_LOCKED"] == "HELD"
    assert namespace["AGENT_E_BUSY"] == _protocol.AGENT_E_BUSY


@pytest.mark.parametrize("line", ["#define NPUSNAP_X (1 + 2)", "#define NPUSNAP_X(a) a", "#define OTHER 1",
                                  '#define NPUSNAP_X "a\\"b"'])
def test_the_generator_refuses_what_it_cannot_carry(tmp_path: Path, line: str) -> None:
    header = tmp_path / "bad.h"
    header.write_text(f"#ifndef NPUSNAP_BAD_H\n#define NPUSNAP_BAD_H\n{line}\n#endif\n")
    out = tmp_path / "gen.py"
    r = _generate([header], out)
    assert r.returncode == 1 and not out.exists()
    assert r.stderr.startswith("gen_protocol: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "bad.h:3" in r.stderr


def test_each_agent_code_and_injector_status_has_one_translation() -> None:
    from npusnap_cli import errors
    from npusnap_cli.platform import agent
    from npusnap_cli.platform.agent import agent_error

    def reported(e: Exception) -> int:
        return agent_error(e, "x").exit_code

    def refused(code: int) -> agent.AgentError:
        return agent.AgentError(agent.AgentReply(False, code, "LOCKED", "no", 0.0, 1, None), "lock")

    codes = {v for k, v in vars(_protocol).items() if k.startswith("AGENT_E_") or k == "AGENT_LOCK_TIMEOUT"}
    expected = {_protocol.AGENT_LOCK_TIMEOUT: errors.LockTimeout.exit_code,
                _protocol.AGENT_E_STATE: errors.WrongState.exit_code,
                _protocol.AGENT_E_NO_RUNTIME: errors.WrongState.exit_code,
                _protocol.AGENT_E_DENIED: errors.PermissionProblem.exit_code}
    assert {code: reported(refused(code)) for code in codes} == {
        code: expected.get(code, errors.DeviceFailed.exit_code) for code in codes}
    assert all(refused(code).hint for code in set(agent.AGENT_CODE_ERRORS))

    statuses = {v for k, v in vars(_protocol).items() if k.startswith("INJECT_") and k != "INJECT_OK"}
    expected = {_protocol.INJECT_NO_PROCESS: errors.TargetNotFound.exit_code,
                _protocol.INJECT_PERMISSION: errors.PermissionProblem.exit_code}
    assert {s: reported(agent.InjectFailed("no", exit_status=s)) for s in statuses} == {
        s: expected.get(s, errors.DeviceFailed.exit_code) for s in statuses}
    assert reported(agent.AgentNotFound("gone")) == errors.WrongState.exit_code
    assert reported(agent.AgentImpostor("squatter")) == errors.PermissionProblem.exit_code
    assert reported(agent.AgentProtocolError("garbled")) == errors.DeviceFailed.exit_code
