"""Writes npusnap_cli/_protocol.py from the protocol headers in native/include/npusnap/.

Run by CMake at build time (native/CMakeLists.txt), so Python's constants always come from the
headers C is compiled with. Every `#define NPUSNAP_NAME VALUE` becomes `NAME: Final = VALUE`;
VALUE must be one literal: an integer, a parenthesized negative integer or a string. A define this
script cannot read stops the build (one line on stderr, exit 1) rather than being left out.

usage: gen_protocol.py --out FILE [--out FILE ...] HEADER...
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Union

PREFIX = "NPUSNAP_"
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)(.*)$")
_GUARD = re.compile(r"NPUSNAP_\w+_H")
_INT = re.compile(r"\(?\s*(-?\s*(?:0[xX][0-9a-fA-F]+|\d+))\s*\)?")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


class HeaderError(Exception):
    pass


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _value(raw: str, where: str) -> Union[int, str]:
    if m := _INT.fullmatch(raw):
        return int(m.group(1).replace(" ", ""), 0)
    if m := _STRING.fullmatch(raw):
        body = m.group(1)
        if "\\" in body:
            raise HeaderError(f"{where}: escapes in string constants are not supported")
        return body
    raise HeaderError(f"{where}: not a single integer or string literal: {raw!r}")


def constants(header: Path) -> list[tuple[str, Union[int, str]]]:
    """The NPUSNAP_* constants of one header, in order, without the prefix."""
    found = []
    for number, line in enumerate(_strip_comments(header.read_text()).splitlines(), 1):
        m = _DEFINE.match(line)
        if not m:
            continue
        name, rest = m.group(1), m.group(2).strip()
        where = f"{header}:{number}: {name}"
        if _GUARD.fullmatch(name) and not rest:
            continue  # the include guard
        if not name.startswith(PREFIX):
            raise HeaderError(f"{where}: constants in these headers are named {PREFIX}*")
        if m.group(2).startswith("("):
            raise HeaderError(f"{where}: function-like macros are not constants")
        found.append((name[len(PREFIX):], _value(rest, where)))
    return found


def render(headers: list[Path]) -> str:
    lines = [
        '"""The protocols shared with the native parts, generated at build time from',
        "native/include/npusnap/*.h by scripts/gen_protocol.py: edit the headers, not this file.",
        '"""',
        "",
        "from typing import Final",
    ]
    seen: dict[str, Path] = {}
    for header in headers:
        lines += ["", f"# {header.name}"]
        for name, value in constants(header):
            if name in seen:
                raise HeaderError(f"{header}: {PREFIX}{name} is also defined in {seen[name]}")
            seen[name] = header
            lines.append(f"{name}: Final = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", action="append", required=True, type=Path)
    parser.add_argument("headers", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        text = render(sorted(args.headers, key=lambda p: p.name))
    except (HeaderError, OSError) as e:
        print(f"gen_protocol: {e}", file=sys.stderr)
        return 1
    for out in args.out:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
