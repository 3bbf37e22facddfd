"""npusnap on a device workload (bench/workload.py under `npusnap run`): H bytes of host
memory and D bytes of npusim device memory, of which a known share is zero.

Per sample (the first on a fresh workload, each next one on the process the previous
sample restored): the storage's write limit on files of the image's size (bench/limits.py);
`npusnap checkpoint --device sim` timed while the target's memory is watched; the images'
bytes on disk, and how many of them are device memory (pages CRIU dumped at addresses the
process did not map before the checkpoint: the runtime's backup staging); eviction from the
page cache (disk only); `npusnap restore --detach` timed; a status check through the agent;
the disk's cold read limit on those files (a tmpfs's read limit is taken with its write
limit); kill. Each rate is held to the limits of its own sample. The daemon's RSS is watched
during both commands: its growth is host memory the checkpoint costs too. Each D that does not fit
the machine (memory, disk, tmpfs) is skipped with the reason printed."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from .limits import READERS, LimitFiles
from .util import (
    PAGE,
    BenchError,
    Budget,
    MemoryWatch,
    Resources,
    child_env,
    disk_usage,
    evict,
    median,
    npusnap,
    npusnap_exe,
    proc_maps,
    proc_status,
    reap,
    start_workload,
    unfit,
    workload_argv,
)

PE_PRESENT = 1 << 2  # criu/include/pagemap.h: the page's data is in pages-*.img


def dumped_pages(ckpt: Path, pid: int, old: list[tuple[int, int]]) -> tuple[int, int]:
    """(bytes CRIU dumped for pid, of which at addresses outside the ranges in old)."""
    import pycriu

    path = ckpt / "criu" / f"pagemap-{pid}.img"
    with open(path, "rb") as f:
        entries = pycriu.images.load(f)["entries"]
    total = outside = 0
    for e in entries[1:]:  # the first entry is the header (pages_id)
        if "flags" in e and not int(e["flags"]) & PE_PRESENT:
            continue
        vaddr = e["vaddr"]
        a = int(vaddr, 0) if isinstance(vaddr, str) else int(vaddr)
        b = a + int(e["nr_pages"]) * PAGE
        covered = sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in old if lo < b and hi > a)
        total += b - a
        outside += (b - a) - covered
    return total, outside


def _phases(run_data: dict[str, Any]) -> dict[str, float]:
    return {p["name"]: float(p["seconds"]) for p in run_data.get("phases", [])}


def _profile(run_data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each phase's and each of its steps' ("phase/step") seconds and bytes, as the command timed them."""
    out: dict[str, dict[str, float]] = {}
    for p in run_data.get("phases", []):
        out[p["name"]] = {"seconds": float(p["seconds"]), "bytes": float(p.get("bytes", 0))}
        for step, v in (p.get("parts") or {}).items():
            out[f"{p['name']}/{step}"] = {"seconds": float(v["seconds"]), "bytes": float(v["bytes"])}
    return out


class DaemonWatch(MemoryWatch):
    """The daemon's RSS growth while a command runs (it lives on: VmHWM would hold its past)."""

    @property
    def peak(self) -> int:
        return max(self.rss_max, proc_status(self.pid).get("VmRSS", 0))


def _series(res: Resources, sock: str, daemon_pid: int, workdir: Path, ckpt_parent: Path, storage: str,
            host: int, dev: int, zero_fraction: float, repeat: int, budget: Budget,
            section: str) -> list[dict[str, Any]]:
    """repeat checkpoint/restore cycles of one workload: each sample checkpoints the
    process the previous sample restored (same pid, same state), which saves starting
    a fresh workload (interpreter, numpy, filling memory) for every sample."""
    from npusnap_cli.platform.agent import AgentClient

    env = child_env({"NPUSIM_SOCKET": sock})
    tag = f"dev-{dev >> 20}m-{storage}"
    out = workdir / f"{tag}.out"
    argv = [*npusnap_exe(), "run", "--", *workload_argv(host, dev, zero_fraction=zero_fraction)]
    w = start_workload(res, argv, out, env=env)
    pid = w.pid
    image = int(w.info["host_bytes"]) + int(w.info["device_nonzero_bytes"])  # what a checkpoint stores
    samples: list[dict[str, Any]] = []
    began = time.monotonic()
    try:
        for i in range(repeat):
            if not budget.more(section, i, repeat, began):
                break
            ckpt = ckpt_parent / f"{tag}-{i}"
            s: dict[str, Any] = {"pid": pid}
            limit_files = LimitFiles(ckpt_parent, f"{tag}-limits", image, disk=storage == "disk")
            try:
                # The limits at the image's size, next to what they bound: this VM writes memory it
                # has not touched lately (a tmpfs, the page cache) the slower the more of it a write
                # takes (a 7 GiB file on a tmpfs: 0.6-1.2 GiB/s, 256 MiB: 2.3-2.6), its disk's rate
                # drifts within minutes, and it reads data the slower the longer ago it was written
                # (LimitFiles): the limit's files, written before the checkpoint, are read once the
                # restore is done, older than the images were when the restore read them. A tmpfs's
                # is removed before the checkpoint: it may not have room for both.
                s["limit"] = {"bytes": image, "write": limit_files.write()}
                if storage != "disk":
                    s["limit"].update(limit_files.read())
                old = proc_maps(pid)
                with MemoryWatch(pid) as mem, DaemonWatch(daemon_pid) as dmem:
                    run = npusnap(["checkpoint", pid, "-D", ckpt, "--device", "sim"], env=env, workdir=workdir)
                reap(pid)  # killed once committed: reap it so its pid is free for the restore
                s["checkpoint_s"] = run.seconds
                s["checkpoint_phases"] = _phases(run.data)
                s["checkpoint_profile"] = _profile(run.data)
                s["memory"] = {
                    "target_rss_before": mem.rss_before, "target_peak": mem.peak, "target_extra": mem.extra,
                    "npusnap_peak_rss": run.self_maxrss, "children_peak_rss": run.children_maxrss,
                    "daemon_growth": dmem.extra,
                    "extra_total": mem.extra + run.self_maxrss + run.children_maxrss + dmem.extra,
                }
                size, allocated = disk_usage(ckpt)
                dumped, staged = dumped_pages(ckpt, pid, old)
                device_files = disk_usage(ckpt / "device")[0] if (ckpt / "device").is_dir() else 0
                s["disk"] = {"bytes": size, "allocated": allocated, "criu_pages": dumped,
                             "device_on_disk": staged + device_files,
                             "device_nonzero": int(w.info["device_nonzero_bytes"]),
                             "device_bytes": int(w.info["device_bytes"])}
                if storage == "disk":
                    evict(ckpt)
                pidfile = workdir / f"{tag}.pid"
                with DaemonWatch(daemon_pid) as dmem:
                    run = npusnap(["restore", ckpt, "--detach", "--pidfile", pidfile], env=env, workdir=workdir,
                                  workload=[pid])
                rpid = int(pidfile.read_text().split()[0])
                os.unlink(pidfile)
                res.add_pid(rpid)
                if rpid != pid:
                    raise BenchError(f"the workload came back as pid {rpid}, not {pid}")
                s["restore_s"] = run.seconds
                s["restore_phases"] = _phases(run.data)
                s["restore_profile"] = _profile(run.data)
                # The daemon's growth on restore is the workload's device memory coming back (it
                # was freed with the checkpointed process): not overhead, recorded but not added.
                s["restore_memory"] = {"npusnap_peak_rss": run.self_maxrss,
                                       "children_peak_rss": run.children_maxrss, "daemon_growth": dmem.extra,
                                       "extra_total": run.self_maxrss + run.children_maxrss}
                state = AgentClient(rpid).status().state
                if state != "RUNNING":
                    raise BenchError(f"restored workload {rpid} is {state}, not RUNNING")
                if storage == "disk":
                    s["limit"].update(limit_files.read(reverse=i % 2 == 1))
            finally:
                shutil.rmtree(ckpt, ignore_errors=True)
                limit_files.remove()
            samples.append(s)
            time.sleep(0.05)
    finally:
        res.kill(pid)
        if out.exists():
            os.unlink(out)
    return samples


def start_daemon(res: Resources, workdir: Path, memory: int) -> tuple[str, int]:
    """A private npusim daemon: (socket, pid)."""
    from npusnap_cli.platform import simdaemon

    sock = str(workdir / "npusim.sock")
    res.daemons.append(sock)
    pid, _ = simdaemon.start(sock, devices=1, memory=memory)
    return sock, pid


def need(host: int, dev: int, storage: str, zero_fraction: float) -> dict[str, int]:
    """What one (D, storage) series needs: the workload's host memory and interpreter, its device
    memory in the daemon, and one checkpoint (zero device chunks are not stored) on disk or tmpfs;
    on a disk, each sample's limit files as well (on a tmpfs its one is removed before the checkpoint)."""
    image = host + int(dev * (1.0 - zero_fraction)) + (64 << 20)
    out = {"memory": host + dev + (512 << 20), "disk": (1 + len(READERS)) * image if storage == "disk" else 0,
           "tmpfs": image if storage == "tmpfs" else 0}
    return out


def section_name(dev: int, storage: str) -> str:
    return f"device-{dev >> 20}m-{storage}"


def sections(host: int, devs: list[int]) -> list[tuple[str, float]]:
    """Budget sections and weights (bytes moved, the limits' files' included; disk counts double,
    plus a fixed cost)."""
    fixed = 256 << 20
    out: list[tuple[str, float]] = []
    for dev in devs:
        out.append((section_name(dev, "disk"), (2 + len(READERS)) * (host + dev) * 2 + fixed))
        out.append((section_name(dev, "tmpfs"), 3 * (host + dev) + fixed))
    return out


def measure(res: Resources, workdir: Path, tmpfs_dir: Path, host: int, devs: list[int], repeat: int,
            zero_fraction: float, limits: dict[str, float], budget: Budget,
            progress: Optional[Any] = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every (D, storage) that fits; returns (runs, {section: why skipped})."""
    from .config import human

    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    plan = []
    for dev in devs:
        for storage, parent in (("disk", workdir), ("tmpfs", tmpfs_dir)):
            n = need(host, dev, storage, zero_fraction)
            why = unfit(n["memory"], n["disk"], workdir, n["tmpfs"], tmpfs_dir)
            if why:
                skipped[section_name(dev, storage)] = why
                if progress:
                    progress(f"skipped: {human(host)} host + {human(dev)} device -> {storage}: {why}")
            else:
                plan.append((dev, storage, parent))
    if not plan:
        return runs, skipped
    # The daemon reserves its memory lazily: sized for the largest D, it costs only what is used.
    sock, daemon_pid = start_daemon(res, workdir, memory=max(d for d, _, _ in plan) + (256 << 20))
    for dev, storage, parent in plan:
        if progress:
            progress(f"device workload: {human(host)} host + {human(dev)} device -> {storage}")
        samples = _series(res, sock, daemon_pid, workdir, parent, storage, host, dev, zero_fraction, repeat,
                          budget, section_name(dev, storage))
        runs.extend(_summarise(samples, storage, host, dev, limits))
    return runs, skipped


def _summarise(samples: list[dict[str, Any]], storage: str, host: int, dev: int,
               limits: dict[str, float]) -> list[dict[str, Any]]:
    state = host + dev
    limit_for = {  # (the run's limit, measured on a file of limits["bytes"]; the samples' own limit)
        ("checkpoint", "disk"): ("disk_write_fsync_Bps", "write"),
        ("restore", "disk"): ("disk_read_cold_Bps", "read"),
        # a file on a tmpfs is written into fresh pages, not copied into touched ones: its write
        # rate (a few times under memcpy's) is the limit there, as the disk's is on a disk
        ("checkpoint", "tmpfs"): ("tmpfs_write_Bps", "write"),
        ("restore", "tmpfs"): ("tmpfs_read_Bps", "read"),
    }
    out = []
    for op in ("checkpoint", "restore"):
        secs = [s[f"{op}_s"] for s in samples]
        names = list(dict.fromkeys(k for s in samples for k in s[f"{op}_phases"]))
        phases = {n: median([s[f"{op}_phases"].get(n, 0.0) for s in samples]) for n in names}
        phases["cli"] = max(0.0, median(secs) - sum(phases.values()))  # start-up, imports, exit
        thr = state / median(secs)
        limit_name, key = limit_for[(op, storage)]
        at_size = [s["limit"][key] for s in samples]  # each sample's own, at the image's size
        limit = median(at_size)
        ratio = median([state / t / lim for t, lim in zip(secs, at_size)])  # each sample against its own
        run: dict[str, Any] = {
            "kind": "device", "tool": "npusnap", "op": op, "storage": storage,
            "host_bytes": host, "device_bytes": dev, "state_bytes": state,
            "seconds": median(secs), "samples": secs, "throughput_Bps": thr,
            "limit": limit_name, "ratio_to_limit": ratio,
            "limit_Bps": limit, "limit_samples": at_size, "limit_file_bytes": samples[0]["limit"]["bytes"],
            "run_limit_Bps": limits[limit_name],  # the run's, on a file of limits["bytes"], for comparison
            "phases": phases,
            "profile": _median_profile([s[f"{op}_profile"] for s in samples]),
        }
        if key == "read" and "by_readers" in samples[0]["limit"]:  # the limit is the best of these
            run["limit_by_readers"] = {n: median([s["limit"]["by_readers"][n] for s in samples])
                                       for n in samples[0]["limit"]["by_readers"]}
        if op == "checkpoint":
            run["memory"] = {k: median([s["memory"][k] for s in samples]) for k in samples[0]["memory"]}
            run["disk"] = {k: median([s["disk"][k] for s in samples]) for k in samples[0]["disk"]}
        else:
            run["memory"] = {k: median([s["restore_memory"][k] for s in samples])
                             for k in samples[0]["restore_memory"]}
        out.append(run)
    return out


def _median_profile(samples: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    names = list(dict.fromkeys(k for s in samples for k in s))
    return {n: {k: median([s[n][k] for s in samples if n in s]) for k in ("seconds", "bytes")} for n in names}
