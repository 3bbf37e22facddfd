"""Plumbing shared by the benchmarks: cleanup of everything started, running the
npusnap CLI with its peak memory, workloads with a readiness line, page-cache
eviction, /proc readers and statistics."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
WORKLOAD = BENCH_DIR / "workload.py"
PAGE = os.sysconf("SC_PAGE_SIZE")


class BenchError(Exception):
    """A measurement could not be taken (the message says which and why)."""


# -- statistics -----------------------------------------------------------------

def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def percentile(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    k = min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


# -- cleanup --------------------------------------------------------------------

class Resources:
    """Everything the run started, undone on close (also after a failure or Ctrl-C):
    processes killed and reaped, npusim daemons stopped, directories removed."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.dirs: list[Path] = []
        self.daemons: list[str] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Resources":
        def to_interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt()

        # SIGINT too: a shell starts background jobs with SIGINT ignored, and Python then
        # never raises KeyboardInterrupt; a benchmark must always be stoppable and clean up.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old[s] = signal.signal(s, to_interrupt)
        return self

    def __exit__(self, *exc: Any) -> None:
        # A second Ctrl-C must not cut the cleanup short.
        for s in self._old:
            signal.signal(s, signal.SIG_IGN)
        try:
            self.close()
        finally:
            for s, h in self._old.items():
                signal.signal(s, h)

    def mkdtemp(self, parent: Path, prefix: str) -> Path:
        parent.mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self.dirs.append(d)
        return d

    def add_pid(self, pid: int) -> None:
        if pid not in self.pids:
            self.pids.append(pid)

    def kill(self, pid: int) -> None:
        kill_and_reap(pid)
        with contextlib.suppress(ValueError):
            self.pids.remove(pid)

    def close(self) -> None:
        for pid in reversed(self.pids):
            kill_and_reap(pid)
        self.pids.clear()
        if self.daemons:
            from npusnap_cli.platform import simdaemon

            for sock in self.daemons:
                with contextlib.suppress(Exception):
                    simdaemon.stop(sock)
            self.daemons.clear()
        for d in reversed(self.dirs):
            shutil.rmtree(d, ignore_errors=True)
        self.dirs.clear()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def kill_and_reap(pid: int, timeout: float = 10) -> None:
    """SIGKILL pid (our child or an adopted orphan) and wait until its pid is free."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.01)


def reap(pid: int, timeout: float = 30) -> None:
    """Wait until pid (killed by a dump; our child or adopted) is gone and its pid free."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            raise BenchError(f"process {pid} did not go away after its checkpoint")
        time.sleep(0.005)


def measure_alone(name: str, dirs: Sequence[Path], measure: Callable[["Resources", list[Path]], dict[str, Any]],
                  line: Optional[Callable[[dict[str, Any]], str]] = None) -> int:
    """One measurement run on its own (python -m bench.NAME): as a subreaper, in a fresh directory
    under each of dirs, everything it started cleaned up after it; its document printed as JSON
    (after line(doc), if given). 1, the error printed, when it raises BenchError (a size that
    does not fit included)."""
    become_subreaper()
    try:
        with Resources() as res:
            doc = measure(res, [res.mkdtemp(d, f"npusnap-bench-{name}-") for d in dirs])
    except BenchError as e:
        print(f"bench.{name}: error: {e}", file=sys.stderr)
        return 1
    if line is not None:
        print(line(doc))
    print(json.dumps(doc, indent=1))
    return 0


def become_subreaper() -> None:
    """Restored processes (orphaned when `criu restore -d` or `npusnap restore --detach`
    exits) are re-parented to us, so we can kill and reap them."""
    from npusnap_cli.platform.criu import become_subreaper as _b

    _b()


# -- workloads ------------------------------------------------------------------

@dataclass
class Workload:
    proc: subprocess.Popen[bytes]
    info: dict[str, Any]
    out: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_workload(res: Resources, argv: list[str], out: Path, env: Optional[dict[str, str]] = None,
                   timeout: float = 120) -> Workload:
    """Start argv (not a shell job: own session, stdio on a file) and wait for `ready {json}`."""
    with open(out, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=out.parent)
    res.add_pid(proc.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith("ready "):
                return Workload(proc, json.loads(line[6:]), out)
        if proc.poll() is not None:
            raise BenchError(f"workload {argv} exited {proc.returncode}: {text[-500:]}")
        time.sleep(0.02)
    raise BenchError(f"workload {argv} not ready after {timeout:.0f} s: {out.read_text(errors='replace')[-500:]}")


def workload_argv(host_bytes: int, device_bytes: int = 0, cpu_only: bool = False,
                  zero_fraction: float = 0.25) -> list[str]:
    argv = [sys.executable, str(WORKLOAD), "--host-mib", str(max(1, host_bytes >> 20)),
            "--device-mib", str(device_bytes >> 20), "--zero-fraction", str(zero_fraction)]
    return argv + (["--cpu-only"] if cpu_only else [])


# -- the npusnap CLI -------------------------------------------------------------

def npusnap_exe() -> list[str]:
    exe = shutil.which("npusnap", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "npusnap_cli"]


def child_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment of everything the benchmark starts. Children run as scripts or
    console scripts, outside the source tree, so they import the *installed* npusnap (what
    `make bench` just installed), never a half-edited checkout."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("NPUSNAP_TEST_PAUSE", None)
    env["NO_COLOR"] = "1"
    env.update(extra or {})
    return env


@dataclass
class CliRun:
    seconds: float
    returncode: int
    stdout: str
    stderr: str
    self_maxrss: int = 0       # bytes: npusnap's own peak RSS (VmHWM)
    children_maxrss: int = 0   # bytes: peak RSS of its largest criu child + its other children
    data: dict[str, Any] = field(default_factory=dict)  # the --json document, if any


def run_timed(argv: list[str], env: Optional[dict[str, str]] = None, timeout: float = 600,
              cwd: Optional[Path] = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run argv and time it; on Ctrl-C the child gets SIGINT first (npusnap rolls back)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=15)
        except BaseException:
            proc.kill()
            proc.wait()
        raise
    seconds = time.perf_counter() - start
    return seconds, subprocess.CompletedProcess(argv, proc.returncode, out, err)


def npusnap(args: Sequence[object], env: Optional[dict[str, str]] = None, timeout: float = 900,
            workdir: Optional[Path] = None, workload: Sequence[int] = ()) -> CliRun:
    """Run `npusnap ARGS --json` in a child that reports its peak memory (bench/_cli.py,
    run as a script: it imports the installed npusnap like the console script does).
    workload: pids that may become npusnap's children (a restored root) without being its cost."""
    fd, rusage_path = tempfile.mkstemp(prefix="rusage-", suffix=".json", dir=workdir)
    os.close(fd)
    try:
        argv = [sys.executable, str(BENCH_DIR / "_cli.py"), rusage_path, *map(str, args), "--json"]
        env = dict(env or child_env())
        if workload:
            env["NPUSNAP_BENCH_WORKLOAD"] = ",".join(map(str, workload))
        seconds, cp = run_timed(argv, env=env, timeout=timeout, cwd=workdir or Path("/"))
        try:
            ru = json.loads(Path(rusage_path).read_text() or "{}")
        except ValueError:
            ru = {}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(rusage_path)
    run = CliRun(seconds, cp.returncode, cp.stdout, cp.stderr, int(ru.get("self_hwm", 0)),
                 int(ru.get("criu_hwm", 0)) + int(ru.get("other_children_hwm", 0)))
    with contextlib.suppress(ValueError):
        run.data = json.loads(cp.stdout) if cp.stdout.strip() else {}
    if cp.returncode != 0:
        tail = " ".join(cp.stderr.strip().splitlines()[-3:])
        raise BenchError(f"npusnap {' '.join(map(str, args))} exited {cp.returncode}: {tail}")
    return run


# -- /proc, memory, page cache ----------------------------------------------------

def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM/... of pid in bytes ({} once it is gone)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.startswith("Vm") or key.startswith("Rss"):
            parts = value.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
    return out


def proc_maps(pid: int) -> list[tuple[int, int]]:
    """The address ranges of pid's mappings, sorted."""
    ranges = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        lo, _, hi = line.split()[0].partition("-")
        ranges.append((int(lo, 16), int(hi, 16)))
    return sorted(ranges)


class MemoryWatch:
    """Polls a process's VmRSS/VmHWM while something else runs, until the process is gone.

    VmHWM is monotonic, so the last value read before the process dies holds the peak if
    the peak came after the watch started; otherwise the highest polled VmRSS is the peak."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        before = proc_status(pid)
        self.rss_before = before.get("VmRSS", 0)
        self.hwm_before = before.get("VmHWM", 0)
        self.hwm_last = self.hwm_before
        self.rss_max = self.rss_before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            st = proc_status(self.pid)
            if not st:
                return
            self.hwm_last = max(self.hwm_last, st.get("VmHWM", 0))
            self.rss_max = max(self.rss_max, st.get("VmRSS", 0))
            self._stop.wait(self.interval)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        return self.hwm_last if self.hwm_last > self.hwm_before else self.rss_max

    @property
    def extra(self) -> int:
        return max(0, self.peak - self.rss_before)


def files_under(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                yield p


def disk_usage(root: Path) -> tuple[int, int]:
    """(sum of file sizes, allocated bytes) under root."""
    size = blocks = 0
    for p in files_under(root):
        st = p.stat()
        size += st.st_size
        blocks += st.st_blocks * 512
    return size, blocks


def evict(path: Path) -> bool:
    """Drop a file (or every file under a directory) from the page cache: write back
    (fdatasync) then POSIX_FADV_DONTNEED. Returns False if nothing could be evicted."""
    targets = [path] if path.is_file() else list(files_under(path))
    ok = True
    for p in targets:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            ok = False
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


def drop_all_caches() -> bool:
    """`echo 3 > /proc/sys/vm/drop_caches`, where permitted (rarely in a container)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mnt = parts[1]
            inside = mnt == "/" or str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) > len(best):
                best, kind = mnt, parts[2]
    return kind


def repeat(n: int, fn: Callable[[int], Any]) -> list[Any]:
    return [fn(i) for i in range(n)]


class Budget:
    """A wall-clock budget for the whole run, split over its sections by weight (roughly
    the bytes each moves). A series always takes its first sample, and another one only
    while, at the pace of those so far, it would end before its section's share runs out
    (shares are cumulative: time a section leaves unused goes to the next ones).
    total=None: no budget, every planned sample is taken."""

    def __init__(self, total: Optional[float], weights: list[tuple[str, float]]) -> None:
        self.total = total
        self.start = time.monotonic()
        self.deadlines: dict[str, float] = {}
        whole = sum(w for _, w in weights) or 1.0
        acc = 0.0
        for name, w in weights:
            acc += w
            self.deadlines[name] = self.start + (total or 0.0) * acc / whole
        self.cut: dict[str, int] = {}  # section -> samples taken, where fewer than planned

    def more(self, section: str, done: int, planned: int, section_start: float) -> bool:
        if done >= planned:
            return False
        if self.total is None or done == 0:
            return True
        now = time.monotonic()
        pace = (now - section_start) / done
        if now + pace <= self.deadlines[section]:
            return True
        self.cut[section] = done
        return False


# -- will it fit ------------------------------------------------------------------

def mem_available() -> int:
    """MemAvailable in bytes (what can be allocated without swapping out others)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def free_space(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


MARGIN = 1 << 30  # left to the rest of the machine (other users, the page cache, the interpreter)


def unfit(memory: int, disk: int = 0, disk_dir: Optional[Path] = None, tmpfs: int = 0,
          tmpfs_dir: Optional[Path] = None) -> Optional[str]:
    """Why a measurement needing this much memory (and disk, tmpfs space) cannot run here
    now, or None if it fits with MARGIN to spare. tmpfs space is memory too."""
    from .config import human

    avail = mem_available()
    if memory + tmpfs + MARGIN > avail:
        return (f"needs {human(memory + tmpfs)} of memory (+{human(MARGIN)} margin), "
                f"{human(avail)} available")
    if disk and disk_dir is not None and disk + MARGIN > free_space(disk_dir):
        return f"needs {human(disk)} on {disk_dir} (+{human(MARGIN)}), {human(free_space(disk_dir))} free"
    if tmpfs and tmpfs_dir is not None and tmpfs + MARGIN > free_space(tmpfs_dir):
        return f"needs {human(tmpfs)} on {tmpfs_dir} (+{human(MARGIN)}), {human(free_space(tmpfs_dir))} free"
    return None


def rows_main(doc: str, prefix: str, default_mib: int, run: Callable[[int, int, Path], dict[str, Any]],
              line: Callable[[dict[str, Any]], str]) -> None:
    """The command line of a benchmark that compares rows of one run (bench.chunkstore,
    bench.devicecompress): --mib, --repeat, --out; the JSON on stdout, one line a row on stderr."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--mib", type=int, default=default_mib, help=f"state size (default {default_mib})")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        result = run(a.mib, a.repeat, Path(tmp))
    text = json.dumps(result, indent=2)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    for way, r in result["rows"].items():
        print(f"{way:>7}: {line(r)}", file=sys.stderr)
