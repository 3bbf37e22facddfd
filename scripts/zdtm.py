#!/usr/bin/env python3
"""Run CRIU's own zdtm static tests with bare CRIU and then through npusnap, and fail if a
test passes bare but fails through npusnap (`make zdtm`).

The tests come from the CRIU source tree scripts/install-criu.sh downloads
($CRIU_CACHE, default /var/cache/npusnap: the tarball, extracted there if needed): every
test its static/Makefile lists, chosen the way CRIU's zdtm.py chooses them in host mode
(its .desc: no ns-only flavour, no 'noauto' or 'crfail', this arch, the 'feature's this
kernel and CRIU have, the test's .checkskip), and built there; one that does not build
here is skipped with the compiler's reason. zdtm.py itself wants namespaces, a built
CRIU tree and more; this starts each test as it does in host mode (`make NAME.pid`: its
--pidfile/--outfile convention, and the test's .hook at the same stages), then

  bare:     criu dump -t PID ... ; criu restore -d ...             (the .desc's opts)
  npusnap:  npusnap checkpoint PID --device none ... ; npusnap restore --detach
            (the .desc's opts as npusnap flags; only tests that pass bare)

then stops it with SIGTERM, and the test's .out says PASS or FAIL. Every step is bounded
in time. The counts at the end: passed bare, passed through npusnap, failed through
npusnap only (KNOWN lists the few outside npusnap's control, with the reason), failed
bare, and skipped with each reason.

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
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent

# A handful for the default test suite (tests/integration/test_zdtm.py): each needs a CRIU option
# npusnap must pass through, or is a plain one.
QUICK = ["env00", "pipe00", "unlink_fstat03", "ghost_multi_hole00", "socket-tcp", "socket-tcp-close2"]

# Tests that pass bare and fail through npusnap for a reason outside npusnap's control. They
# still run (and a pass says the entry is stale); they do not fail the run.
KNOWN: dict[str, str] = {}

# CRIU option -> how many values follow it, for those npusnap has a flag of the same spelling.
CGROUP_FLAGS = {"--manage-cgroups": 0, "--cgroup-root": 1, "--cgroup-yard": 1}
DUMP_FLAGS = {"--link-remap": 0, "--ghost-limit": 1, "--ext-unix-sk": 0, "--tcp-established": 0,
              "--skip-in-flight": 0, "--tcp-close": 0, "--shell-job": 0, "--external": 1, "--network-lock": 1,
              "--force-irmap": 0, "--irmap-scan-path": 1, **CGROUP_FLAGS}
RESTORE_FLAGS = {"--tcp-close": 0, "--external": 1, "--join-ns": 1, **CGROUP_FLAGS}
# CRIU options npusnap has no flag for because it needs none: always on, or CRIU's internal choice ...
NEEDLESS = {"--file-locks": 0, "--ghost-fiemap": 0, "--no-ghost-fiemap": 0}
# ... and, on restore, those the checkpoint recorded in its manifest (restore takes them from there)
# or that mean something at dump time only.
RECORDED = {"--tcp-established": 0, "--link-remap": 0, "--ext-unix-sk": 0, "--skip-in-flight": 0,
            "--ghost-limit": 1, "--network-lock": 1, "--force-irmap": 0, "--irmap-scan-path": 1}
STEP_TIMEOUT = 60
# What zdtm.py gives a test in host mode without a kernel freezer.
TEST_ENV = {"ZDTM_THREAD_BOMB": "5"}


@dataclass
class Outcome:
    ok: bool
    why: str = ""


@dataclass
class Row:
    test: str
    skipped: str = ""  # why it was not run at all
    bare: Outcome = field(default_factory=lambda: Outcome(False, "not run"))
    npusnap: Outcome = field(default_factory=lambda: Outcome(False, "not run"))

    @property
    def regression(self) -> bool:
        return self.bare.ok and not self.npusnap.ok

    @property
    def unexplained(self) -> bool:
        return self.regression and self.test not in KNOWN


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


def listed_tests(static: Path) -> list[str]:
    """The tests static/Makefile builds and starts with `make NAME.pid` (its $(TST))."""
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(static), "-f", "Makefile", "-f", "-",
                        "npusnap-list-tests"], input="npusnap-list-tests:\n\t@echo $(TST)\n",
                       capture_output=True, text=True, timeout=STEP_TIMEOUT)
    if r.returncode != 0:
        raise Failed(f"cannot list the tests of {static}: {r.stderr.strip()[-300:]}")
    return sorted(set(r.stdout.split()))


def build(tree: Path, tests: list[str]) -> dict[str, str]:
    """Build what can be built (make -k); returns why each test that did not build failed."""
    zdtm = tree / "test" / "zdtm"
    jobs = str(os.cpu_count() or 2)
    r = subprocess.run(["make", "-s", "-j", jobs, "-C", str(zdtm / "lib")], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise Failed(f"building zdtm's lib failed:\n{r.stderr[-2000:]}")
    r = subprocess.run(["make", "-s", "-k", "-j", jobs, "-C", str(zdtm / "static"), *tests],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    unbuilt = {}
    for t in tests:
        if not os.access(zdtm / "static" / t, os.X_OK):
            unbuilt[t] = _build_error(r.stderr, t)
    return unbuilt


def _build_error(stderr: str, test: str) -> str:
    lines = [x.strip() for x in stderr.splitlines() if (f"{test}.c" in x or f"{test}.o" in x or f" {test}]" in x)]
    why = next((x for x in lines if "error" in x), lines[0] if lines else "see make's output")
    return f"does not build here: {why[:200]}"


def desc_of(static: Path, test: str) -> dict[str, Any]:
    """The test's .desc: a Python expression zdtm.py evaluates (most are dict literals; a few use os)."""
    path = static / f"{test}.desc"
    if not path.exists():
        return {}
    text = path.read_text().strip()
    if not text:
        return {}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = eval(compile(text, str(path), "eval"), {"os": os})  # noqa: S307 (the checksummed CRIU tree)
    return dict(value) if isinstance(value, dict) else {}


def flags(desc: dict[str, Any]) -> list[str]:
    return str(desc.get("flags", "")).split()


class Chooser:
    """Why zdtm.py would not run a test in host mode here (None: it would), in its own order."""

    def __init__(self, tree: Path, criu: str) -> None:
        self.tree = tree
        self.criu = criu
        self.features: dict[str, bool] = {}
        self.arch = platform.machine()
        spec = tree / "test" / "zdtm.desc"
        excluded = desc_of(spec.parent, "zdtm").get("exclude", []) if spec.exists() else []
        self.excluded = {os.path.basename(x) for x in excluded if x.startswith("static/")}

    def feature(self, name: str) -> bool:
        if name not in self.features:
            r = subprocess.run([self.criu, "check", "--feature", name], capture_output=True, text=True,
                               timeout=STEP_TIMEOUT, stdin=subprocess.DEVNULL)
            self.features[name] = r.returncode == 0
        return self.features[name]

    def checkskip(self, test: str) -> bool:
        path = f"zdtm/static/{test}.checkskip"
        if not os.access(self.tree / "test" / path, os.X_OK):
            return False
        try:
            r = subprocess.run([path], cwd=self.tree / "test", capture_output=True, timeout=STEP_TIMEOUT,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return True
        return r.returncode != 0

    def why_not(self, test: str, desc: dict[str, Any]) -> Optional[str]:
        if test in self.excluded:
            return "excluded by zdtm.desc"
        if desc.get("arch", self.arch) != self.arch:  # compared whole, as zdtm.py does
            return f"arch is {desc['arch']!r}, not {self.arch!r}"
        if "noauto" in flags(desc):
            return "manual run only ('noauto')"
        missing = [f for f in str(desc.get("feature", "")).split() if not self.feature(f)]
        if missing:
            return f"no {missing[0]} feature here (criu check --feature {missing[0]})"
        if self.checkskip(test):
            return "its .checkskip says this machine lacks what it needs"
        if "h" not in str(desc.get("flavor", "h ns uns")).split():
            return "needs namespaces (no host flavour: " + str(desc.get("flavor")) + ")"
        if "crfail" in flags(desc):
            return "expected to fail checkpoint/restore ('crfail')"
        return None


@contextlib.contextmanager
def locked(static: Path) -> Iterator[None]:
    """One test at a time in a tree, whoever runs it: tests write NAME.pid and NAME.out next to
    themselves, and many listen on the same port. Held per test, not per run, so a quick run
    (the test suite's) gets its turns while a full one goes on."""
    with open(static / ".npusnap-zdtm.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    time.sleep(0.02)  # a waiting run wakes up and takes the lock before our next test does


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


# ---------------------------------------------------------------- CRIU's network lock


def lock_left(images: Path) -> set[str]:
    """CRIU's network lock still standing for the connections this dump locked: iptables DROP
    rules for their ports (sparing packets with CRIU's mark, 0xc114) and the dump's nftables
    table. Only the dump's own: other users of the machine lock their connections meanwhile."""
    from npusnap_cli import netlock

    if not (images / "files.img").exists():
        return set()
    ports = {f"--sport {a} --dport {b} " for c in netlock.dumped_connections(images)
             for a, b in ((c.sport, c.dport), (c.dport, c.sport))}
    out = set()
    for tool in ("iptables-save", "ip6tables-save") if ports else ():
        if shutil.which(tool):
            r = subprocess.run([tool, "-t", "filter"], capture_output=True, text=True, timeout=STEP_TIMEOUT,
                               stdin=subprocess.DEVNULL)
            out |= {f"{tool.replace('-save', '')}\t{x}" for x in r.stdout.splitlines()
                    if "0xc114" in x and any(p in x + " " for p in ports)}
    run_id = netlock.dump_run_id(images)
    if run_id and netlock.nft(f"list table {netlock.nft_table(run_id)}")[0]:
        out.add(f"nft\ttable {netlock.nft_table(run_id)}")
    return out


def remove_lock(items: set[str]) -> None:
    """Take away lock rules a test left (a failed restore keeps the dump's lock, as CRIU must)."""
    from npusnap_cli import netlock

    for item in items:
        tool, _, rule = item.partition("\t")
        if tool == "nft":
            netlock.nft(f"delete {rule}")
        elif rule.startswith("-A "):
            subprocess.run([tool, "-w", "-t", "filter", "-D", *shlex.split(rule)[1:]], capture_output=True,
                           timeout=STEP_TIMEOUT, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- one test, one way


def unmount_leftovers(static: Path, test: str) -> None:
    """What a test mounted under its own NAME.test paths and left (cgroup tests that failed
    halfway): unmounted, deepest first, or the next test of its kind finds the hierarchy busy."""
    prefix = f"{static}/{test}."
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=STEP_TIMEOUT, stdin=subprocess.DEVNULL)


def clean(static: Path, test: str) -> None:
    unmount_leftovers(static, test)
    for suffix in (".pid", ".out", ".out.inprogress", ".out.external"):
        with contextlib.suppress(FileNotFoundError):
            (static / f"{test}{suffix}").unlink()
    for p in glob.glob(str(static / f"{test}.*test*")):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


def translate(opts: list[str], table: dict[str, int], needless: dict[str, int]) -> list[str]:
    """The .desc's CRIU options as npusnap flags; Failed for one npusnap has no flag for."""
    out, i = [], 0
    while i < len(opts):
        opt = opts[i]
        name = opt.split("=", 1)[0]
        if name in table:
            n = table[name] if "=" not in opt else 0
            out.extend(opts[i:i + 1 + n])
            i += 1 + n
        elif name in needless:
            i += 1 + (needless[name] if "=" not in opt else 0)
        else:
            raise Failed(f"npusnap has no flag for CRIU's {opt}")
    return out


def hook(tree: Path, test: str, stage: str, env: dict[str, str], logfile: Path) -> None:
    """The test's .hook at a stage, as zdtm.py runs it (from test/, with ZDTM_TEST_PID and ZDTM_IMG_DIR).
    Its output goes to the log file, not a pipe: a hook may leave a daemon behind that holds it."""
    path = f"zdtm/static/{test}.hook"
    if not os.access(tree / "test" / path, os.X_OK):
        return
    with open(logfile, "a") as f:
        f.write(f"$ {path} {stage}\n")
        f.flush()
        start_at = f.tell()
        # Python hooks import pycriu from the tree (../lib): their python3 is ours, which has protobuf.
        search = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
        proc = subprocess.Popen([path, stage], cwd=tree / "test", env={**os.environ, **env, "PATH": search},
                                stdin=subprocess.DEVNULL, stdout=f, stderr=f)
    try:
        proc.wait(timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise Failed(f"hook {stage} timed out") from None
    if proc.returncode != 0:
        with open(logfile, errors="replace") as f:
            f.seek(start_at)
            last = [x for x in f.read().splitlines() if x.strip()][-1:] or [f"exit {proc.returncode}"]
        raise Failed(f"hook {stage} failed: {last[0][:200]}")


def start(tree: Path, static: Path, test: str, desc: dict[str, Any], logfile: Path) -> int:
    """`make NAME.pid` (the test daemonizes once ready), its post-start hook meanwhile, as zdtm.py does.
    Output to the log file, not a pipe, which a test that never got ready might hold open."""
    timeout = max(STEP_TIMEOUT, int(desc.get("timeout") or 0))
    with open(logfile, "a") as f:
        f.write(f"$ make {test}.pid\n")
        f.flush()
        start_at = f.tell()
        make = subprocess.Popen(["make", "--no-print-directory", "-C", str(static), f"{test}.pid"],
                                env={**os.environ, **TEST_ENV}, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
    try:
        hook(tree, test, "--post-start", {}, logfile)
        make.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed("start timed out") from None
    finally:
        if make.poll() is None:
            make.kill()
            make.wait()
    pidfile = static / f"{test}.pid"
    if make.returncode != 0 or not pidfile.exists():
        with open(logfile, errors="replace") as f:
            f.seek(start_at)
            last = [x for x in f.read().splitlines() if x.strip()][-1:] or [f"exit {make.returncode}"]
        out = static / f"{test}.out"  # the test's own reason, when it gave one (its first error)
        said = [x for x in out.read_text(errors="replace").splitlines() if "ERR:" in x or "FAIL:" in x][:1] \
            if out.exists() else []
        raise Failed(f"start failed: {(said or last)[0][:200]}")
    return int(pidfile.read_text().split()[0])


PATH_OPTS = ("--cgroup-yard",)  # .desc options whose value may be a relative path


def absolute(opts: list[str], tree: Path, test: str) -> list[str]:
    """zdtm.py runs CRIU in the images directory, test/dump/zdtm/static/NAME/PID/1: a relative
    path in a .desc means one from there (cgroup_yard's six ../ reach test/)."""
    images = tree / "test" / "dump" / "zdtm" / "static" / test / "PID" / "1"
    out = list(opts)
    for i, opt in enumerate(out[:-1]):
        if opt in PATH_OPTS and not out[i + 1].startswith("/"):
            out[i + 1] = os.path.normpath(images / out[i + 1])
    return out


def run_one(tree: Path, test: str, desc: dict[str, Any], way: str, npusnap: str, criu: str,
            lock: str, work: Path) -> Outcome:
    static = tree / "test" / "zdtm" / "static"
    desc = {k: " ".join(absolute(str(v).split(), tree, test)) if k in ("opts", "dopts", "ropts") else v
            for k, v in desc.items()}
    opts = str(desc.get("opts", "")).split()
    dump_opts = opts + str(desc.get("dopts", "")).split()
    restore_opts = opts + str(desc.get("ropts", "")).split()
    logfile = work / f"{test}.{way}.log"
    images = work / f"{test}.{way}.img"
    clean(static, test)
    criu_images = images if way == "bare" else images / "criu"
    pid = 0
    try:
        if way == "npusnap":  # before starting: an option npusnap lacks is a failure, not a crash
            dump_flags = translate(dump_opts, DUMP_FLAGS, NEEDLESS)
            # Of the common opts, those the checkpoint recorded restore must take from the manifest.
            restore_flags = translate(restore_opts, RESTORE_FLAGS, {**NEEDLESS, **RECORDED})
        # As root: zdtm.py would drop the test to an unprivileged uid, but without CAP_SYS_RESOURCE
        # (containers) CRIU then cannot read its rlimits, bare or not.
        pid = start(tree, static, test, desc, logfile)
        env = {"ZDTM_TEST_PID": str(pid)}
        hook(tree, test, "--pre-dump", env, logfile)
        if way == "bare":
            images.mkdir()
            locking = [] if "--network-lock" in dump_opts or "--tcp-established" not in dump_opts else [
                "--network-lock", lock]
            run([criu, "dump", "-t", str(pid), "-D", str(images), "-o", "dump.log", "-v4", *locking, *dump_opts],
                "criu dump", logfile, images / "dump.log")
            wait_gone(pid, 10)
            hook(tree, test, "--pre-restore", env, logfile)
            run([criu, "restore", "-d", "-D", str(images), "-o", "restore.log", "-v4", *locking, *restore_opts],
                "criu restore", logfile, images / "restore.log")
            env["ZDTM_IMG_DIR"] = str(criu_images)
        else:
            run([npusnap, "checkpoint", str(pid), "-D", str(images), "--device", "none", *dump_flags],
                "npusnap checkpoint", logfile)
            wait_gone(pid, 10)
            hook(tree, test, "--pre-restore", env, logfile)
            run([npusnap, "restore", str(images), "--detach", *restore_flags], "npusnap restore", logfile)
            env["ZDTM_IMG_DIR"] = str(criu_images)
        hook(tree, test, "--post-restore", env, logfile)
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
        left = lock_left(criu_images)
        if left and way == "npusnap":  # a tree that runs on must have its connections unlocked
            raise Failed(f"CRIU's network lock was left behind: {sorted(left)[0].partition(chr(9))[2][:150]}")
        return Outcome(True)
    except Failed as e:
        return Outcome(False, str(e))
    finally:
        if pid and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
        with contextlib.suppress(Failed):
            hook(tree, test, "--clean", {}, logfile)
        kill_leftovers()
        remove_lock(lock_left(criu_images))
        with contextlib.suppress(OSError):
            if images.exists():
                shutil.rmtree(images, ignore_errors=True)
        clean(static, test)


# ---------------------------------------------------------------- the run


def summary(rows: list[Row]) -> str:
    ran = [r for r in rows if not r.skipped]
    bare = [r for r in ran if r.bare.ok]
    lines = []
    for r in ran:
        if r.regression:
            tag = f"known: {KNOWN[r.test]}" if r.test in KNOWN else "FAILS THROUGH NPUSNAP"
            lines.append(f"  {r.test}: {tag}: {r.npusnap.why}")
        elif r.test in KNOWN and r.npusnap.ok:
            lines.append(f"  {r.test}: passes through npusnap now; its KNOWN entry is stale")
    for r in ran:
        if not r.bare.ok:
            lines.append(f"  {r.test}: fails bare: {r.bare.why}")
    reasons = Counter(r.skipped for r in rows if r.skipped)
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        names = [r.test for r in rows if r.skipped == reason]
        lines.append(f"  skipped {n}: {reason}: {', '.join(names[:8])}{' ...' if n > 8 else ''}")
    regressions = [r for r in ran if r.regression]
    known = sum(r.test in KNOWN for r in regressions)
    lines.append(f"{len(rows)} tests: {len(ran)} run, {len(rows) - len(ran)} skipped; "
                 f"{len(bare)} pass bare, {len(ran) - len(bare)} fail bare; through npusnap "
                 f"{sum(r.npusnap.ok for r in bare)} of those {len(bare)} pass, {len(regressions)} fail"
                 + (f" ({known} known, outside npusnap's control)" if known else ""))
    return "\n".join(lines)


def run_all(tree: Path, rows: list[Row], descs: dict[str, dict[str, Any]], npusnap: str, criu: str,
            lock: str) -> None:
    """Bare first, every test; then through npusnap, the tests that passed bare."""
    ran = [r for r in rows if not r.skipped]
    with tempfile.TemporaryDirectory(prefix="npusnap-zdtm-") as tmp:
        for way in ("bare", "npusnap"):
            todo = [r for r in ran if way == "bare" or r.bare.ok]
            log(f"{way}: {len(todo)} tests")
            for i, row in enumerate(todo, 1):
                with locked(tree / "test" / "zdtm" / "static"):
                    outcome = run_one(tree, row.test, descs[row.test], way, npusnap, criu, lock, Path(tmp))
                setattr(row, way, outcome)
                log(f"{way} {i}/{len(todo)} {row.test}: " + ("pass" if outcome.ok else f"FAIL ({outcome.why})"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated test names (default: every test the tree has)")
    ap.add_argument("--quick", action="store_true", help=f"a handful: {', '.join(QUICK)}")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--npusnap", default=str(ROOT / ".venv" / "bin" / "npusnap"))
    ap.add_argument("--criu", default=shutil.which("criu", path="/usr/local/sbin:" + os.environ.get("PATH", ""))
                    or "criu")
    args = ap.parse_args()
    if os.geteuid() != 0:
        log("needs root (CRIU)")
        return 2
    sys.path.insert(0, str(ROOT))
    from npusnap_cli import netlock

    lock = netlock.choose(None, args.criu)
    become_subreaper()
    start_time = time.monotonic()
    try:
        tree = criu_tree()
        static = tree / "test" / "zdtm" / "static"
        with locked(static):  # the build, too, writes into the tree
            known = listed_tests(static)
            tests = args.only.split(",") if args.only else QUICK if args.quick else known
            missing = [t for t in tests if t not in known]
            if missing:
                raise Failed(f"no such zdtm static test: {', '.join(missing)}")
            chooser = Chooser(tree, args.criu)
            rows = [Row(t) for t in tests]
            descs = {t: desc_of(static, t) for t in tests}
            for row in rows:
                row.skipped = chooser.why_not(row.test, descs[row.test]) or ""
            to_build = [r.test for r in rows if not r.skipped]
            log(f"building {len(to_build)} of {len(tests)} tests in {static}")
            unbuilt = build(tree, to_build) if to_build else {}
        for row in rows:
            row.skipped = row.skipped or unbuilt.get(row.test, "")
        run_all(tree, rows, descs, args.npusnap, args.criu, lock)
    except Failed as e:
        log(str(e))
        return 2
    print(summary(rows))
    print(f"({time.monotonic() - start_time:.0f} s; bare CRIU locks the network with {lock} where a test needs it)")
    if args.json:
        args.json.write_text(json.dumps([{"test": r.test, "skipped": r.skipped, "bare": asdict(r.bare),
                                          "npusnap": asdict(r.npusnap), "known": KNOWN.get(r.test, "")}
                                         for r in rows], indent=1))
    return 1 if any(r.unexplained for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
