#!/usr/bin/env python3
"""List the CANN runtime functions npusim's toolkit does not export.

Reads every function declared in a hicann/runtime checkout's public ACL headers
(include/external/acl/*.h) and every acl*/aclnn*/Msprof* function its samples (example/) call,
and compares them with the dynamic symbols of the libraries in npusim's toolkit lib64/. Prints the
missing functions, the ones samples call first (with how many samples call each), then the counts.

    cann_missing.py RUNTIME_CHECKOUT [--json]

A sample is a directory of example/ with a CMakeLists.txt (as scripts/cann_samples.py counts them);
its calls are the names followed by "(" in its sources and the shared sources it includes.
Exit 0 when it ran (whatever the counts), 2 on bad arguments, 3 when npusim is not installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# `ACL_FUNC_VISIBILITY aclError aclrtFoo(` / `MSVP_PROF_API ... aclprofFoo(`, possibly wrapped.
DECLARATION = re.compile(r"\b(?:ACL_FUNC_VISIBILITY|MSVP_PROF_API)\b[^;{}()]*?\b([A-Za-z_]\w*)\s*\(", re.S)
CALL = re.compile(r"\b((?:acl|Msprof|msprof)\w*)\s*\(")
SOURCES = ("*.cpp", "*.c", "*.h", "*.hpp", "*.cc")
# Macros and types the call pattern also catches.
NOT_FUNCTIONS = {"aclError"}


def fail(code: int, message: str) -> "None":
    print(f"cann_missing: {message}", file=sys.stderr)
    sys.exit(code)


def declared(include: Path) -> set[str]:
    names: set[str] = set()
    for header in sorted(include.glob("*.h")):
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", header.read_text(errors="replace"), flags=re.S)
        text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)  # the visibility macros' own definitions
        names.update(DECLARATION.findall(text))
    return names


def sample_calls(example: Path) -> dict[str, set[str]]:
    """Function name -> the samples (paths relative to example/) that call it."""
    users: dict[str, set[str]] = defaultdict(set)
    shared = [f for pattern in SOURCES for f in example.glob(pattern)]  # utils.h and friends
    for cmake in sorted(example.rglob("CMakeLists.txt")):
        sample = cmake.parent
        if sample == example or "build" in sample.relative_to(example).parts:
            continue
        files = [f for pattern in SOURCES for f in sample.rglob(pattern)]
        # The headers a sample shares with its siblings (../kernel_utils.h, ...).
        files += [f for pattern in SOURCES for f in sample.parent.glob(pattern)] + shared
        name = str(sample.relative_to(example))
        for f in files:
            for fn in CALL.findall(re.sub(r"/\*.*?\*/|//[^\n]*", " ", f.read_text(errors="replace"), flags=re.S)):
                if fn not in NOT_FUNCTIONS:
                    users[fn].add(name)
    return users


def exported(lib64: Path) -> set[str]:
    names: set[str] = set()
    for lib in sorted(lib64.glob("*.so")):
        r = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
        if r.returncode != 0:  # a linker script (libacl_rt.so names libascendcl.so)
            continue
        names.update(line.split()[-1] for line in r.stdout.splitlines() if line.split()[1:2] in (["T"], ["W"]))
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="an extracted hicann/runtime checkout (holds include/ and example/)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    include = args.checkout / "include" / "external" / "acl"
    example = args.checkout / "example"
    if not include.is_dir() or not example.is_dir():
        ap.error(f"{args.checkout} has no include/external/acl and example/: not a hicann/runtime checkout")
    try:
        from npusnap_cli import native
    except ImportError:
        fail(3, "npusnap is not installed in this interpreter (run it with the project's .venv/bin/python)")
    lib64 = native.TOOLKIT_HOME / "lib64"
    have = exported(lib64)
    if not have:
        fail(3, f"no runtime library in {lib64} (make setup)")

    headers = declared(include)
    users = sample_calls(example)
    # A sample's call counts when the headers declare it or it looks like a runtime function
    # (acl*, Msprof*: the samples' own helpers are named otherwise).
    missing_headers = sorted(headers - have)
    runtime_like = ("acl", "Msprof")
    called = {fn: sorted(s) for fn, s in users.items()
              if fn not in have and (fn in headers or fn.startswith(runtime_like))}
    by_use = sorted(called, key=lambda fn: (-len(called[fn]), fn))
    result = {
        "declared": len(headers),
        "declared_missing": len(missing_headers),
        "called_missing": len(called),
        "called": [{"function": fn, "samples": called[fn]} for fn in by_use],
        "missing": missing_headers,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("called by samples, not exported (samples calling it):")
    for fn in by_use:
        print(f"  {len(called[fn]):3}  {fn}")
    print("declared in the headers, not exported:")
    for fn in missing_headers:
        print(f"       {fn}")
    print(f"\ndeclared: {len(headers)} functions, {len(missing_headers)} not exported; "
          f"called by samples and not exported: {len(called)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
