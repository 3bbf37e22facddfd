#!/usr/bin/env python3
"""Build and run the CANN runtime's own samples (hicann/runtime, example/) against npusim.

Each sample is built and run the way its README says, unchanged: the toolkit's set_env.sh,
ASCEND_INSTALL_PATH pointing at npusim's toolkit, example/set_sample_env.sh (SOC_VERSION and
ASCENDC_CMAKE_DIR), then the sample's own run.sh, with a private npusimd (2 devices) running.
A sample succeeds when its run.sh exits 0 and, where the sample prints a [SUCCESS] line, printed
it. Samples are copied to a scratch directory first: the checkout is only read.

    cann_samples.py RUNTIME_CHECKOUT [--only SUBSTRING] [--timeout S] [--json] [--keep]

A sample "needs a kernel" when its CMakeLists builds an AscendC kernel library
(ascendc_library / ascendc_fatbin_library) or its code calls the operator API (aclnn*, whose
operators are kernels). For those the script also checks that the host code compiles
(`-fsyntax-only` against the toolkit's headers). Exit 0 when it ran (whatever the counts), 2 on
bad arguments, 3 when npusim is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

KERNEL_CMAKE = re.compile(r"^\s*ascendc_(fatbin_)?library\s*\(", re.M)
OPERATOR_API = re.compile(r"\baclnn[A-Z]\w*\s*\(")


@dataclass
class Result:
    sample: str
    needs_kernel: bool
    built: bool
    ran_ok: bool
    host_compiles: Optional[bool]  # kernel samples only
    note: str


def fail(code: int, message: str) -> "None":
    print(f"cann_samples: {message}", file=sys.stderr)
    sys.exit(code)


def toolkit_paths() -> tuple[Path, Path]:
    try:
        from npusnap_cli import native
    except ImportError:
        fail(3, "npusnap is not installed in this interpreter (run it with the project's .venv/bin/python)")
    if not native.NPUSIMD.exists() or not (native.TOOLKIT_HOME / "set_env.sh").exists():
        fail(3, f"npusim's toolkit is not installed at {native.TOOLKIT_HOME} (make setup)")
    return native.TOOLKIT_HOME, native.NPUSIMD


def start_daemon(npusimd: Path, sock: str) -> subprocess.Popen:
    proc = subprocess.Popen([str(npusimd), "--socket", sock, "--devices", "2", "--memory", str(1 << 30),
                             "--foreground"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 15)
    if not ready or not proc.stdout.readline().startswith(b"ready"):
        proc.kill()
        proc.wait()
        fail(3, "npusimd did not start")
    return proc


def stop_daemon(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def sample_env(example: Path, toolkit: Path, sock: str) -> dict[str, str]:
    """The environment after the README's steps: set_env.sh, ASCEND_INSTALL_PATH, set_sample_env.sh."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND", "SOC_VERSION", "LD_PRELOAD"))}
    base["NPUSIM_SOCKET"] = sock
    script = (f'source "{toolkit}/set_env.sh" && export ASCEND_INSTALL_PATH="{toolkit}" && '
              f'source "{example}/set_sample_env.sh" >/dev/null && env -0')
    r = subprocess.run(["bash", "-c", script], env=base, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        fail(3, f"set_sample_env.sh failed: {(r.stdout + r.stderr).decode(errors='replace')[-500:]}")
    env = dict(item.split("=", 1) for item in r.stdout.decode().split("\0") if "=" in item)
    return env


def find_samples(example: Path) -> list[Path]:
    return sorted(p.parent for p in example.rglob("CMakeLists.txt")
                  if "build" not in p.relative_to(example).parts and p.parent != example)


def needs_kernel(sample: Path) -> bool:
    if KERNEL_CMAKE.search((sample / "CMakeLists.txt").read_text(errors="replace")):
        return True
    return any(OPERATOR_API.search(f.read_text(errors="replace")) for f in sample.glob("*.cpp"))


def tail(text: str, n: int = 1) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # A compiler's or linker's own line says most; make's "Error 2" says nothing.
    make_summary = re.compile(r"g?make(\[\d+\])?: \*\*\* \[")
    patterns = (r"error:|undefined reference|No rule to make target", r"\[(ERROR|FAILURE)\]|FAIL", r"error|\bfailed\b")
    for pattern in patterns:
        found = [line for line in lines if re.search(pattern, line, re.I) and not make_summary.match(line)]
        if found:
            return " | ".join(found[:n])[:200]
    return " | ".join(lines[-n:])[:200]


def host_compiles(sample: Path, example: Path, toolkit: Path) -> bool:
    """Whether the sample's host sources compile against the toolkit's headers (kernel files left out)."""
    cmake = (sample / "CMakeLists.txt").read_text(errors="replace")
    kernel_files = set(re.findall(r"([\w./-]+\.(?:cpp|asc))", " ".join(
        re.findall(r"ascendc_(?:fatbin_)?library\s*\(([^)]*)\)", cmake))))
    sources = [f for f in sample.glob("*.cpp") if f.name not in {Path(k).name for k in kernel_files}]
    sources = [f for f in sources if "__global__" not in f.read_text(errors="replace")]
    # The sample's CMakeLists add its parent directories (shared utils headers) to the include path.
    parents = [f"-I{p}" for p in sample.parents if p == example or example in p.parents]
    for src in sources:
        r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{toolkit / 'include'}", f"-I{example}",
                            f"-I{sample}", *parents, f"-I{example / '..'}", str(src)], capture_output=True,
                           timeout=120)
        if r.returncode != 0:
            return False
    return bool(sources)


def run_sample(sample: Path, example: Path, toolkit: Path, env: dict[str, str], timeout: float) -> Result:
    name = str(sample.relative_to(example))
    kernel = needs_kernel(sample)
    run_sh = sample / "run.sh"
    compiles = host_compiles(sample, example, toolkit) if kernel else None
    build = subprocess.run(["bash", "-c", 'cmake -B build -DASCEND_CANN_PACKAGE_PATH="$ASCEND_HOME_PATH" '
                            '>/dev/null && cmake --build build -j2'],
                           cwd=sample, env=env, capture_output=True, text=True, timeout=600)
    built = build.returncode == 0
    if kernel and built:
        compiles = True  # its own build compiled the host code
    if not built:
        return Result(name, kernel, False, False, compiles, tail(build.stdout + build.stderr))
    if not run_sh.exists():
        return Result(name, kernel, True, False, compiles, "no run.sh (a multi-machine sample)")
    try:
        r = subprocess.run(["bash", str(run_sh)], cwd=sample, env=env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired:
        return Result(name, kernel, True, False, compiles, f"run.sh timed out after {timeout:.0f} s")
    out = r.stdout + r.stderr
    wants_line = "[SUCCESS]" in run_sh.read_text(errors="replace") or any(
        "[SUCCESS]" in f.read_text(errors="replace") for f in sample.glob("*.cpp"))
    ok = r.returncode == 0 and ("[SUCCESS]" in out or not wants_line) and "[FAILURE]" not in out
    note = "" if ok else tail(out) or f"exit {r.returncode}"
    return Result(name, kernel, True, ok, compiles, note)


def summary(results: list[Result]) -> dict[str, object]:
    plain = [r for r in results if not r.needs_kernel]
    kernel = [r for r in results if r.needs_kernel]
    return {
        "samples": len(results),
        "no_kernel": {"total": len(plain), "built": sum(r.built for r in plain),
                      "ran_ok": sum(r.ran_ok for r in plain)},
        "kernel": {"total": len(kernel), "host_compiles": sum(bool(r.host_compiles) for r in kernel),
                   "built": sum(r.built for r in kernel), "ran_ok": sum(r.ran_ok for r in kernel)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="an extracted hicann/runtime checkout (holds example/)")
    ap.add_argument("--only", default="", help="run only samples whose path contains this")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per sample run (default 120)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path goes to stderr)")
    args = ap.parse_args()
    source = args.checkout / "example"
    if not (source / "set_sample_env.sh").is_file():
        ap.error(f"{args.checkout} has no example/set_sample_env.sh: not a hicann/runtime checkout")
    toolkit, npusimd = toolkit_paths()
    scratch = Path(tempfile.mkdtemp(prefix="cann-samples-"))
    sock_dir = tempfile.mkdtemp(prefix="npx-")
    os.chmod(sock_dir, 0o700)
    daemon = start_daemon(npusimd, os.path.join(sock_dir, "d.sock"))
    try:
        shutil.copytree(source, scratch / "example", symlinks=True)
        if (args.checkout / "include").is_dir():  # some samples include ../include paths
            shutil.copytree(args.checkout / "include", scratch / "include", symlinks=True)
        example = scratch / "example"
        env = sample_env(example, toolkit, os.path.join(sock_dir, "d.sock"))
        results = []
        for sample in find_samples(example):
            if args.only and args.only not in str(sample.relative_to(example)):
                continue
            results.append(run_sample(sample, example, toolkit, env, args.timeout))
            if not args.json:
                r = results[-1]
                print(f"{'kernel' if r.needs_kernel else 'plain ':6} {'built' if r.built else '-----'} "
                      f"{'OK  ' if r.ran_ok else 'FAIL'} {r.sample:70} {r.note}", flush=True)
    finally:
        stop_daemon(daemon)
        shutil.rmtree(sock_dir, ignore_errors=True)
        if args.keep:
            print(f"cann_samples: kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    counts = summary(results)
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results], "counts": counts}, indent=2))
    else:
        nk, k = counts["no_kernel"], counts["kernel"]
        print(f"\nno kernel: {nk['total']} samples, {nk['built']} built, {nk['ran_ok']} ran to their success line")  # type: ignore[index]
        print(f"kernel:    {k['total']} samples, host code compiles in {k['host_compiles']}, "  # type: ignore[index]
              f"{k['built']} built, {k['ran_ok']} ran OK")  # type: ignore[index]
    return 0


if __name__ == "__main__":
    sys.exit(main())
