"""A CPU-only process holding S bytes: bare `criu dump` / `criu restore -d` against
`npusnap checkpoint --device none` / `npusnap restore --detach`, on the same disk.

One process serves every sample: each tool checkpoints the process the previous
sample restored (same pid, same memory). The two tools alternate so drift on a shared
machine hits both alike. Before each restore the images are evicted from the page cache (both
tools read them cold). Bare CRIU does not fsync its images; npusnap does (and checksums
them), which is part of what the ratio shows: the checkpoint is compared with bare CRIU + that
fsync (the eviction's write-back), the restore with bare CRIU. A tiny process measures npusnap's
fixed cost (start-up, imports, RPC, manifest) as the difference from bare CRIU, in seconds.
sweep() measures one such process per size (64 MiB ... 4 GiB of RSS), skipping those that
do not fit the machine."""

from __future__ import annotations

import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any

from .util import (
    BenchError,
    Budget,
    MemoryWatch,
    Resources,
    child_env,
    disk_usage,
    evict,
    median,
    npusnap,
    reap,
    run_timed,
    start_workload,
    unfit,
    workload_argv,
)


def _bare_dump(criu: str, pid: int, images: Path) -> float:
    images.mkdir()
    seconds, cp = run_timed([criu, "dump", "-t", str(pid), "-D", str(images), "-o", "dump.log", "-v4",
                             "--file-locks"])
    if cp.returncode != 0:
        raise BenchError(f"criu dump exited {cp.returncode}: {_log_tail(images / 'dump.log')}")
    return seconds


def _bare_restore(criu: str, images: Path) -> tuple[float, int]:
    pidfile = images.parent / (images.name + ".pid")
    seconds, cp = run_timed([criu, "restore", "-D", str(images), "-o", "restore.log", "-v4", "--file-locks",
                             "-d", "--pidfile", str(pidfile)])
    if cp.returncode != 0:
        raise BenchError(f"criu restore exited {cp.returncode}: {_log_tail(images / 'restore.log')}")
    return seconds, int(pidfile.read_text().split()[0])


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = [ln for ln in lines if "Error" in ln] or lines
    return " | ".join(errors[-3:])


def _sample(res: Resources, tool: str, criu: str, workdir: Path, pid: int, i: int) -> dict[str, Any]:
    """Checkpoint pid with tool, then restore it with the same tool (same pid again)."""
    ckpt = workdir / f"cpu-{tool}-{i}"
    sample: dict[str, Any] = {"tool": tool}
    try:
        cpu = _children_cpu()
        if tool == "criu":
            sample["checkpoint_s"] = _bare_dump(criu, pid, ckpt)
            sample["checkpoint_cpu_s"] = _children_cpu() - cpu
        else:
            with MemoryWatch(pid) as mem:
                run = npusnap(["checkpoint", pid, "-D", ckpt, "--device", "none"], workdir=workdir)
            sample["checkpoint_cpu_s"] = _children_cpu() - cpu
            sample["checkpoint_s"] = run.seconds
            # What the checkpoint costs the machine in host memory beyond the workload's own.
            sample["extra_memory"] = mem.extra + run.self_maxrss + run.children_maxrss
            sample["checkpoint_phases"] = {p["name"]: p["seconds"] for p in run.data.get("phases", [])}
        reap(pid)  # killed by the dump: its pid must be free for the restore
        sample["bytes_on_disk"] = disk_usage(ckpt)[0]
        t = time.perf_counter()
        evict(ckpt)  # for bare CRIU this is also the fsync it never did
        sample["evict_s"] = time.perf_counter() - t
        cpu = _children_cpu()
        if tool == "criu":
            sample["restore_s"], rpid = _bare_restore(criu, ckpt)
            sample["restore_cpu_s"] = _children_cpu() - cpu
        else:
            pidfile = workdir / f"cpu-{tool}-{i}.pid"
            run = npusnap(["restore", ckpt, "--detach", "--pidfile", pidfile], workdir=workdir, workload=[pid])
            sample["restore_cpu_s"] = _children_cpu() - cpu
            sample["restore_s"] = run.seconds
            sample["restore_phases"] = {p["name"]: p["seconds"] for p in run.data.get("phases", [])}
            sample["restore_extra_memory"] = run.self_maxrss + run.children_maxrss
            rpid = int(pidfile.read_text().split()[0])
            os.unlink(pidfile)
        res.add_pid(rpid)
        if rpid != pid:
            raise BenchError(f"{tool} restored pid {rpid}, expected {pid}")
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
        with_unlink(ckpt.parent / (ckpt.name + ".pid"))
    return sample


def _children_cpu() -> float:
    """CPU seconds (user + system) of our reaped children and theirs: around one command, what it
    and the processes it waited for (criu, the guardian) burnt. On a loaded machine wall time
    swings with the neighbours; this mostly does not. The dumped workload is reaped only later."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def with_unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


def weight(nbytes: int) -> float:
    """Budget weight: two tools, each writing and reading nbytes, plus CLI start-up."""
    return 2 * 2 * nbytes + (512 << 20)


def measure(res: Resources, criu: str, workdir: Path, nbytes: int, repeat: int, budget: Budget,
            section: str = "cpu-only") -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {"criu": [], "npusnap": []}
    out = workdir / "cpu.out"
    w = start_workload(res, workload_argv(nbytes, cpu_only=True), out, env=child_env())
    began = time.monotonic()
    try:
        for i in range(repeat):
            if not budget.more(section, i, repeat, began):
                break
            order = ("criu", "npusnap") if i % 2 == 0 else ("npusnap", "criu")
            for tool in order:
                samples[tool].append(_sample(res, tool, criu, workdir, w.pid, i))
                time.sleep(0.05)
    finally:
        res.kill(w.pid)
        with_unlink(out)
    runs = []
    summary: dict[str, Any] = {"bytes": nbytes}
    for tool, ss in samples.items():
        for op in ("checkpoint", "restore"):
            secs = [s[f"{op}_s"] for s in ss]
            names = list(dict.fromkeys(k for s in ss for k in s.get(f"{op}_phases", {})))
            phases = {n: median([s[f"{op}_phases"].get(n, 0.0) for s in ss]) for n in names}
            if phases:
                phases["cli"] = max(0.0, median(secs) - sum(phases.values()))
            runs.append({
                "kind": "cpu-only", "tool": tool, "op": op, "storage": "disk",
                "host_bytes": nbytes, "device_bytes": 0, "state_bytes": nbytes,
                "seconds": median(secs), "samples": secs, "throughput_Bps": nbytes / median(secs),
                "phases": phases, "bytes_on_disk": median([s["bytes_on_disk"] for s in ss]),
            })
            summary[f"{tool}_{op}_s"] = median(secs)
    durable = median([s["checkpoint_s"] + s["evict_s"] for s in samples["criu"]])
    summary["criu_checkpoint_plus_fsync_s"] = durable
    summary["checkpoint_ratio_vs_criu_plus_fsync"] = summary["npusnap_checkpoint_s"] / durable
    summary["checkpoint_ratio"] = summary["npusnap_checkpoint_s"] / summary["criu_checkpoint_s"]
    summary["restore_ratio"] = summary["npusnap_restore_s"] / summary["criu_restore_s"]
    # What npusnap adds, in seconds: its fixed cost on a tiny process, its growth with size on a big one.
    summary["checkpoint_overhead_s"] = summary["npusnap_checkpoint_s"] - durable
    summary["restore_overhead_s"] = summary["npusnap_restore_s"] - summary["criu_restore_s"]
    # The same from the fastest sample of each (the one the machine's load disturbed least), and in
    # CPU time (npusnap's own work: start-up, imports, guardian, RPC, manifest, over CRIU's).
    fastest = {(tool, op): min(s[f"{op}_s"] for s in ss) for tool, ss in samples.items()
               for op in ("checkpoint", "restore")}
    summary["checkpoint_overhead_min_s"] = (fastest["npusnap", "checkpoint"]
                                            - min(s["checkpoint_s"] + s["evict_s"] for s in samples["criu"]))
    summary["restore_overhead_min_s"] = fastest["npusnap", "restore"] - fastest["criu", "restore"]
    for op in ("checkpoint", "restore"):
        cpu = {tool: median([s[f"{op}_cpu_s"] for s in ss]) for tool, ss in samples.items()}
        summary[f"criu_{op}_cpu_s"], summary[f"npusnap_{op}_cpu_s"] = cpu["criu"], cpu["npusnap"]
        summary[f"{op}_overhead_cpu_s"] = cpu["npusnap"] - cpu["criu"]
    summary["npusnap_extra_memory"] = median([s["extra_memory"] for s in samples["npusnap"]])
    summary["npusnap_restore_extra_memory"] = median([s["restore_extra_memory"] for s in samples["npusnap"]])
    # Bare CRIU made durable, as a run of its own: the plot's bare-CRIU checkpoint line.
    runs.append({"kind": "cpu-only", "tool": "criu+fsync", "op": "checkpoint", "storage": "disk",
                 "host_bytes": nbytes, "device_bytes": 0, "state_bytes": nbytes, "seconds": durable,
                 "samples": [s["checkpoint_s"] + s["evict_s"] for s in samples["criu"]],
                 "throughput_Bps": nbytes / durable, "phases": {}})
    summary["runs"] = runs
    return summary


def need(nbytes: int) -> dict[str, int]:
    """What one size needs: the workload's memory (plus its interpreter) and one image on disk."""
    return {"memory": nbytes + (256 << 20), "disk": nbytes}


def sweep(res: Resources, criu: str, workdir: Path, sizes: list[int], repeat: int, budget: Budget,
          progress: Any = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """measure() at each size that fits; returns (summaries, {section: why skipped})."""
    from .config import human

    out: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for n in sizes:
        section = section_name(n)
        why = unfit(need(n)["memory"], need(n)["disk"], workdir)
        if why:
            skipped[section] = why
            if progress:
                progress(f"skipped: CPU-only process of {human(n)}: {why}")
            continue
        if progress:
            progress(f"CPU-only process of {human(n)}: bare criu vs npusnap")
        out.append(measure(res, criu, workdir, n, repeat, budget, section=section))
    return out, skipped


def section_name(nbytes: int) -> str:
    return f"cpu-only-{nbytes >> 20}m"



def main() -> None:
    """python -m bench.cpuonly [--mib 1] [--repeat 7]: only the fixed-cost rows (a tiny CPU-only
    process, bare CRIU vs npusnap, alternating), without the rest of the bench."""
    from npusnap_cli.platform.criu import find_criu

    from .util import become_subreaper, rows_main

    def run(mib: int, repeat: int, workdir: Path) -> dict[str, Any]:
        become_subreaper()
        with Resources() as res:
            s = measure(res, find_criu().path, workdir, mib << 20, repeat, Budget(None, [("cpu-only", 1.0)]))
        s.pop("runs")
        ms = {k: round(v * 1000, 1) for k, v in s.items() if k.endswith("_s")}
        rows = {op: {k.removesuffix("_s").replace(f"{op}_", ""): v for k, v in ms.items() if op in k}
                for op in ("checkpoint", "restore")}
        return {"state_mib": mib, "repeat": repeat, "ms": ms, "rows": rows}

    rows_main(main.__doc__ or "", "npusnap-bench-tiny-", 1, run,
              lambda r: " ".join(f"{k} {v:.0f}ms" for k, v in r.items()))


if __name__ == "__main__":
    main()
