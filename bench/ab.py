"""python -m bench.ab A_PYTHON B_PYTHON [--rounds N] [--output FILE] [BENCH ARGS...]

Two installations of npusnap compared side by side on a loaded machine: each round runs
`python -m bench --profile --repeat 1 BENCH ARGS` once with A's interpreter and once with B's
(which goes first alternates), so both see the same load over time; the table gives each device
run's and phase's median and minimum seconds for A and for B, and B/A of the medians.

Both run this checkout's bench/ (copied to a directory of its own: a checkout on the path would
shadow the installed npusnap), each with its own installed npusnap and npusim daemon: A_PYTHON is
e.g. /work/main/.venv/bin/python, B_PYTHON .venv/bin/python."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from .util import BENCH_DIR, median


def parse(argv: Optional[list[str]]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("a", help="interpreter of installation A (the baseline)")
    ap.add_argument("b", help="interpreter of installation B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", type=Path, help="the rounds' results (JSON)")
    return ap.parse_known_args(argv)


def run_once(python: str, tree: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    cp = subprocess.run([python, "-m", "bench", "--profile", "--repeat", "1", "--budget", "0", "--output",
                         str(out), *extra], cwd=tree, capture_output=True, text=True, timeout=1800)
    if cp.returncode != 0:
        raise SystemExit(f"bench.ab: {python} -m bench exited {cp.returncode}: {cp.stderr.strip()[-2000:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def timings(doc: dict[str, Any]) -> dict[str, float]:
    """'op storage' -> wall seconds, and 'op storage: phase[/step]' -> seconds, of one --profile run."""
    out: dict[str, float] = {}
    for r in doc["runs"]:
        key = f"{r['op']} D={r['device_bytes'] >> 20}M -> {r['storage']}"
        out[key] = r["seconds"]
        for name, v in r.get("profile", {}).items():
            out[f"{key}: {name}"] = v["seconds"]
        out[f"{key}: cli"] = r["phases"].get("cli", 0.0)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    args, extra = parse(argv)
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        tree = Path(tmp)
        shutil.copytree(BENCH_DIR, tree / "bench", ignore=shutil.ignore_patterns("__pycache__", "results.*"))
        for i in range(args.rounds):
            order = [("A", args.a), ("B", args.b)] if i % 2 == 0 else [("B", args.b), ("A", args.a)]
            got = {}
            for label, python in order:
                print(f"bench.ab: round {i + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
                got[label] = timings(run_once(python, tree, tree / f"{label}-{i}.json", extra))
            rounds.append(got)
    if args.output:
        args.output.write_text(json.dumps(rounds, indent=1))
    print_table(rounds)
    return 0


def print_table(rounds: list[dict[str, dict[str, float]]]) -> None:
    keys = list(dict.fromkeys(k for r in rounds for side in ("A", "B") for k in r[side]))
    print(f"{'':60} {'A median':>9} {'A min':>8} {'B median':>9} {'B min':>8} {'B/A':>6}")
    for k in keys:
        a = [r["A"][k] for r in rounds if k in r["A"]]
        b = [r["B"][k] for r in rounds if k in r["B"]]
        ma, mb = median(a), median(b)
        ratio = f"{mb / ma:6.2f}" if a and b and ma > 0 else ""
        print(f"{k:60} {ma:9.3f} {min(a, default=float('nan')):8.3f} {mb:9.3f} "
              f"{min(b, default=float('nan')):8.3f} {ratio:>6}")


if __name__ == "__main__":
    sys.exit(main())
