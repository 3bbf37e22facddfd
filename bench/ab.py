"""python -m bench.ab A_PYTHON B_PYTHON [C_PYTHON ...] [--rounds N] [--output FILE] [BENCH ARGS...]

Installations of npusnap compared side by side on a loaded machine: each round runs
`python -m bench --profile --repeat 1 BENCH ARGS` once with each one's interpreter (which goes
first rotates), so all see the same load over time; the table gives each device run's and
phase's median and minimum seconds for each, and each one's median over A's.

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
    ap.add_argument("pythons", nargs="+", metavar="PYTHON",
                    help="the installations' interpreters: A (the baseline), B, ...")
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
    if len(args.pythons) < 2:
        raise SystemExit("bench.ab: give two interpreters at least")
    labels = [chr(ord("A") + i) for i in range(len(args.pythons))]
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        tree = Path(tmp)
        shutil.copytree(BENCH_DIR, tree / "bench", ignore=shutil.ignore_patterns("__pycache__", "results.*"))
        for i in range(args.rounds):
            k = i % len(labels)
            order = list(zip(labels, args.pythons))
            got = {}
            for label, python in order[k:] + order[:k]:
                print(f"bench.ab: round {i + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
                got[label] = timings(run_once(python, tree, tree / f"{label}-{i}.json", extra))
            rounds.append(got)
    if args.output:
        args.output.write_text(json.dumps(rounds, indent=1))
    print_table(rounds, labels)
    return 0


def print_table(rounds: list[dict[str, dict[str, float]]], labels: list[str]) -> None:
    keys = list(dict.fromkeys(k for r in rounds for side in labels for k in r[side]))
    head = "".join(f" {x + ' median':>9} {x + ' min':>7}" + (f" {x + '/A':>5}" if x != "A" else "") for x in labels)
    print(f"{'':60}{head}")
    for k in keys:
        row = ""
        base = median([r["A"][k] for r in rounds if k in r["A"]])
        for x in labels:
            got = [r[x][k] for r in rounds if k in r[x]]
            m = median(got)
            row += f" {m:9.3f} {min(got, default=float('nan')):7.3f}"
            if x != "A":
                row += f" {m / base:5.2f}" if got and base > 0 else f" {'':5}"
        print(f"{k:60}{row}")


if __name__ == "__main__":
    sys.exit(main())
