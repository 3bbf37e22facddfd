#!/usr/bin/env python3
"""Run CRIU's own zdtm static tests twice, with bare CRIU and through npusnap, and
fail if a test passes bare but fails through npusnap (`make zdtm`).

The tests come from the CRIU source tree scripts/install-criu.sh downloads
($CRIU_CACHE, default /var/cache/npusnap: the tarball, extracted there if needed).
zdtm.py itself wants namespaces, a built CRIU tree and more; this starts each test
the way it does in host mode (`make NAME.pid`: its --pidfile/--outfile convention),
then

  bare:     criu dump -t PID ... ; criu restore -d ...             (the .desc's opts)
  npusnap:  npusnap checkpoint PID --device none ... ; npusnap restore --detach
            (the .desc's opts as npusnap flags)

then stops it with SIGTERM, and the test's .out says PASS or FAIL.

usage: scripts/zdtm.py [--only T1,T2] [--quick] [--json FILE] [--npusnap PATH] [--criu PATH]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import ctypes
import fcntl
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent

# The tests issue 13 names (each needs a CRIU option npusnap must pass through) ...
NAMED = ["unlink_fstat03", "ghost_multi_hole00", "ghost_multi_hole01", "socket-ext", "socket-tcp",
         "socket-tcpbuf", "socket-tcp-skip-in-flight", "socket-dump-tcp-close", "socket-tcp-close2"]
# ... and a broad set of simple ones that work in host mode (no namespaces, no hooks).
BROAD = ["env00", "pipe00", "pipe01", "pipe02", "sleeping00", "fpu00", "fpu01", "fpu02", "mmx00", "sse00",
         "sse20", "futex", "futex-rl", "mprotect00", "timers", "posix_timers", "wait00", "zombie00",
         "pthread00", "pthread01", "vdso00", "pstree", "sockets01", "sockets02", "sockets_spair",
         "socket_queues", "socket_listen", "socket_listen6", "socket_udp", "socket6_udp", "socket-tcp-listen",
         "socket-tcp-close0", "socket-tcp-close1", "socket-tcp-keepalive", "socket-linger", "socket-tcp6",
         "sk-unix-unconn", "selfexe00", "maps02", "maps04", "xids00", "file_cloexec", "proc-self", "eventfs00",
         "signalfd00", "rlimits00", "pty00", "sigpending", "sigaltstack", "stopped", "scm00", "fd", "memfd00",
         "oom_score_adj", "clone_fs", "write_read00", "unlink_fstat00", "unlink_fstat01", "unlink_fstat02",
         "link10", "cwd00", "inotify00", "fifo", "fifo-ghost", "deleted_unix_sock", "file_shared",
         "file_append", "symlink", "umask00"]
QUICK = ["env00", "pipe00", "unlink_fstat03", "ghost_multi_hole00", "socket-tcp", "socket-tcp-close2"]

# CRIU option -> npusnap flag (same spelling; the value follows where CRIU takes one).
DUMP_FLAGS = {"--link-remap": 0, "--ghost-limit": 1, "--ext-unix-sk": 0, "--tcp-established": 0,
              "--skip-in-flight": 0, "--tcp-close": 0, "--shell-job": 0, "--external": 1}
RESTORE_FLAGS = {"--tcp-close": 0, "--external": 1}
# CRIU options npusnap has no flag for because it needs none: always on, or CRIU's internal choice.
NEEDLESS = {"--file-locks": 0, "--ghost-fiemap": 0, "--no-ghost-fiemap": 0}
STEP_TIMEOUT = 60


@dataclass
class Outcome:
    ok: bool
    why: str = ""


@dataclass
class Row:
    test: str
    bare: Outcome = field(default_factory=lambda: Outcome(False, "not run"))
    npusnap: Outcome = field(default_factory=lambda: Outcome(False, "not run"))

    @property
    def regression(self) -> bool:
        return self.bare.ok and not self.npusnap.ok


class Failed(Exception):
    pass


def log(msg: str) -> None:
    print(f"zdtm: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the CRIU tree


def criu_tree() -> Path:
    cache = Path(os.environ.get("CRIU_CACHE", "/var/cache/npusnap"))
    trees = sorted(glob.glob(str(cache / "criu-*" / "test" / "zdtm" / "static")))
    if trees:
        return Path(trees[-1]).parents[2]
    tarballs = sorted(glob.glob(str(cache / "criu_*.orig.tar.xz")))
    if not tarballs:
        raise Failed(f"no CRIU source in {cache}: run scripts/install-criu.sh (or set CRIU_CACHE)")
    log(f"extracting {tarballs[-1]}")
    subprocess.run(["tar", "xf", tarballs[-1], "-C", str(cache)], check=True)
    return criu_tree()


def build(tree: Path, tests: list[str]) -> None:
    zdtm = tree / "test" / "zdtm"
    jobs = str(os.cpu_count() or 2)
    for args in (["-C", str(zdtm / "lib")], ["-C", str(zdtm / "static"), *tests]):
        r = subprocess.run(["make", "-s", "-j", jobs, *args], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise Failed(f"building zdtm failed: {' '.join(args)}\n{r.stderr[-2000:]}")


def desc_of(static: Path, test: str) -> dict[str, str]:
    path = static / f"{test}.desc"
    if not path.exists():
        return {}
    text = path.read_text().strip()
    return ast.literal_eval(text) if text else {}


@contextlib.contextmanager
def locked(static: Path) -> Iterator[None]:
    """One run at a time in a tree: tests write NAME.pid and NAME.out next to themselves."""
    with open(static / ".npusnap-zdtm.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# ---------------------------------------------------------------- processes


def become_subreaper() -> None:
    # Daemonized tests and restored trees are reparented to us: we reap them all.
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
        raise Failed("prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap()
        if not alive(pid):
            reap()
            return True
        time.sleep(0.02)
    return False


def our_children() -> list[int]:
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(Path(f"/proc/{d}/stat").read_text().rpartition(")")[2].split()[1]) == me:
                    out.append(int(d))
    return out


def kill_leftovers() -> None:
    """Whatever a test or a restore left behind (we are its subreaper) goes, and is reaped."""
    for _ in range(3):
        kids = [p for p in our_children() if alive(p)]
        if not kids:
            break
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in kids:
            wait_gone(pid, 5)
    reap()


def run(cmd: list[str], what: str, logfile: Path, criu_log: Optional[Path] = None) -> None:
    with open(logfile, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        try:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=STEP_TIMEOUT,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Failed(f"{what} timed out") from None
        f.write(r.stderr)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        if criu_log is not None:
            from npusnap_cli.platform.criu import explain

            last = explain(criu_log)[0] or last
        raise Failed(f"{what} failed (exit {r.returncode}): {last[:300]}")


# ---------------------------------------------------------------- one test, one way


def clean(static: Path, test: str) -> None:
    for suffix in (".pid", ".out", ".out.inprogress", ".out.external"):
        with contextlib.suppress(FileNotFoundError):
            (static / f"{test}{suffix}").unlink()
    for p in glob.glob(str(static / f"{test}.*test*")):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


def translate(opts: list[str], table: dict[str, int]) -> list[str]:
    """The .desc's CRIU options as npusnap flags; Failed for one npusnap has no flag for."""
    out, i = [], 0
    while i < len(opts):
        opt = opts[i]
        name = opt.split("=", 1)[0]
        if name in table:
            n = table[name] if "=" not in opt else 0
            out.extend(opts[i:i + 1 + n])
            i += 1 + n
        elif name in NEEDLESS:
            i += 1 + (NEEDLESS[name] if "=" not in opt else 0)
        else:
            raise Failed(f"npusnap has no flag for CRIU's {opt}")
    return out


def run_one(static: Path, test: str, desc: dict[str, str], way: str, npusnap: str, criu: str,
            lock: str, work: Path) -> Outcome:
    opts = desc.get("opts", "").split()
    dump_opts = opts + desc.get("dopts", "").split()
    restore_opts = opts + desc.get("ropts", "").split()
    logfile = work / f"{test}.{way}.log"
    clean(static, test)
    pid = 0
    try:
        if way == "npusnap":  # before starting: an option npusnap lacks is a failure, not a crash
            dump_flags = translate(dump_opts, DUMP_FLAGS)
            # The .desc's common opts were recorded by the checkpoint: restore must take them from there.
            restore_flags = translate(desc.get("ropts", "").split(), RESTORE_FLAGS)
        # As root: zdtm.py would drop the test to an unprivileged uid, but without CAP_SYS_RESOURCE
        # (containers) CRIU then cannot read its rlimits, bare or not.
        try:
            r = subprocess.run(["make", "--no-print-directory", "-C", str(static), f"{test}.pid"],
                               capture_output=True, text=True, timeout=STEP_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Failed("start timed out") from None
        pidfile = static / f"{test}.pid"
        if r.returncode != 0 or not pidfile.exists():
            raise Failed(f"start failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:200]}")
        pid = int(pidfile.read_text().split()[0])
        images = work / f"{test}.{way}.img"
        if way == "bare":
            images.mkdir()
            locking = ["--network-lock", lock] if "--tcp-established" in dump_opts else []
            run([criu, "dump", "-t", str(pid), "-D", str(images), "-o", "dump.log", "-v4", *locking, *dump_opts],
                "criu dump", logfile, images / "dump.log")
            wait_gone(pid, 10)
            run([criu, "restore", "-d", "-D", str(images), "-o", "restore.log", "-v4", *locking, *restore_opts],
                "criu restore", logfile, images / "restore.log")
        else:
            run([npusnap, "checkpoint", str(pid), "-D", str(images), "--device", "none", *dump_flags],
                "npusnap checkpoint", logfile)
            wait_gone(pid, 10)
            run([npusnap, "restore", str(images), "--detach", *restore_flags], "npusnap restore", logfile)
        if not alive(pid):
            raise Failed("the restored test is not running")
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, 30):
            raise Failed("the test did not stop on SIGTERM")
        pid = 0
        out = static / f"{test}.out"
        text = out.read_text(errors="replace") if out.exists() else ""
        if "PASS" not in text.split():
            last = [line for line in text.splitlines() if line.strip()][-1:] or ["no output"]
            raise Failed(f"test says: {last[0][:200]}")
        return Outcome(True)
    except Failed as e:
        return Outcome(False, str(e))
    finally:
        if pid and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
        kill_leftovers()
        with contextlib.suppress(OSError):
            if (work / f"{test}.{way}.img").exists():
                shutil.rmtree(work / f"{test}.{way}.img", ignore_errors=True)
        clean(static, test)


# ---------------------------------------------------------------- the run


def table(rows: list[Row]) -> str:
    def cell(o: Outcome) -> str:
        return "pass" if o.ok else "FAIL"

    w = max([len(r.test) for r in rows] + [4])
    lines = [f"{'test':<{w}}  bare  npusnap  note", f"{'-' * w}  ----  -------  ----"]
    for r in rows:
        note = r.npusnap.why if r.regression else (r.bare.why if not r.bare.ok else "")
        lines.append(f"{r.test:<{w}}  {cell(r.bare):<4}  {cell(r.npusnap):<7}  {note}")
    both = sum(r.bare.ok and r.npusnap.ok for r in rows)
    bare_only = sum(r.regression for r in rows)
    neither = sum(not r.bare.ok and not r.npusnap.ok for r in rows)
    npusnap_only = sum(not r.bare.ok and r.npusnap.ok for r in rows)
    lines.append(f"{len(rows)} tests: {both} pass both ways, {bare_only} pass bare but fail through npusnap, "
                 f"{npusnap_only} pass only through npusnap, {neither} fail both ways")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated test names (default: the issue's tests and a broad set)")
    ap.add_argument("--quick", action="store_true", help=f"a handful: {', '.join(QUICK)}")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--npusnap", default=str(ROOT / ".venv" / "bin" / "npusnap"))
    ap.add_argument("--criu", default=shutil.which("criu", path="/usr/local/sbin:" + os.environ.get("PATH", ""))
                    or "criu")
    args = ap.parse_args()
    if os.geteuid() != 0:
        log("needs root (CRIU)")
        return 2
    tests = args.only.split(",") if args.only else QUICK if args.quick else NAMED + BROAD
    sys.path.insert(0, str(ROOT))
    from npusnap_cli import netlock

    lock = netlock.choose(None, args.criu)
    try:
        tree = criu_tree()
        static = tree / "test" / "zdtm" / "static"
        missing = [t for t in tests if not (static / f"{t}.c").exists()]
        if missing:
            raise Failed(f"no such zdtm static test: {', '.join(missing)}")
        log(f"building {len(tests)} tests in {static}")
        build(tree, tests)
    except Failed as e:
        log(str(e))
        return 2
    become_subreaper()
    rows: list[Row] = []
    start = time.monotonic()
    with locked(static), tempfile.TemporaryDirectory(prefix="npusnap-zdtm-") as tmp:
        work = Path(tmp)
        for test in tests:
            desc = desc_of(static, test)
            row = Row(test)
            row.bare = run_one(static, test, desc, "bare", args.npusnap, args.criu, lock, work)
            row.npusnap = run_one(static, test, desc, "npusnap", args.npusnap, args.criu, lock, work)
            log(f"{test}: bare {'pass' if row.bare.ok else 'FAIL'}, npusnap {'pass' if row.npusnap.ok else 'FAIL'}"
                + (f" ({row.npusnap.why or row.bare.why})" if not (row.bare.ok and row.npusnap.ok) else ""))
            rows.append(row)
    print(table(rows))
    print(f"({time.monotonic() - start:.0f} s; bare CRIU locks the network with {lock} where a test needs it)")
    if args.json:
        args.json.write_text(json.dumps([{"test": r.test, "bare": asdict(r.bare), "npusnap": asdict(r.npusnap)}
                                         for r in rows], indent=1))
    return 1 if any(r.regression for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
