"""Targets, bench/results.json, the terminal table and (full run) bench/results.png."""

from __future__ import annotations

import json
import math
import os
import platform
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from .config import MIB, human


def target(name: str, value: float, goal: float, cmp: str, unit: str, detail: str = "") -> dict[str, Any]:
    finite = isinstance(value, (int, float)) and math.isfinite(value)
    met = finite and (value >= goal if cmp == ">=" else value <= goal)
    return {"name": name, "value": round(float(value), 4) if finite else None, "goal": goal, "met": bool(met),
            "cmp": cmp, "unit": unit, "detail": detail}


def targets(limits: dict[str, Any], cpus: list[dict[str, Any]], runs: list[dict[str, Any]],
            ping: dict[str, Any], helps: dict[str, Any], copy: dict[str, Any],
            tiny: Optional[dict[str, Any]] = None, live: Optional[dict[str, Any]] = None,
            incr: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    out = device_targets(limits, runs)
    out += cpu_targets(cpus, tiny)
    if incr and incr.get("written_ratio") is not None:  # bench/incremental.py
        out += incremental_targets(incr)
    if live and live.get("downtime_ratio") is not None:  # bench/live.py
        out.append(target(f"live checkpoint, D={human(live['device_bytes']).replace(' ', '')}: downtime / full "
                          "--leave-running checkpoint", live["downtime_ratio"], 0.25, "<=", "x",
                          f"{live['live_downtime_s']:.3f} s stopped vs {live['full_s']:.3f} s "
                          f"({live['live_total_s']:.3f} s in all)"))
    out.append(target("agent round trip (median of pings)", ping["median_ms"], 1.0, "<=", "ms",
                      f"p99 {ping['p99_ms']:.3f} ms over {ping['count']}"))
    out.append(target("`npusnap --help`", helps["median_ms"], 150.0, "<=", "ms", f"median of {helps['count']}"))
    for way, label in (("h2d", "host->device"), ("d2h", "device->host")):
        rate = copy[f"{way}_Bps"]
        out.append(target(f"npusim {label} copy of {human(copy['bytes'])} / memcpy", rate / limits["memcpy_Bps"], 0.7,
                          ">=", "x", f"{human(rate)}/s vs {human(limits['memcpy_Bps'])}/s"))
    return out


def incremental_targets(inc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's figures for a second checkpoint (--parent, and --dedup for host pages) after a
    tenth of the device and host memory changed: its bytes written and its time against the first's."""
    size = f"D={human(inc['device_bytes']).replace(' ', '')} H={human(inc['host_bytes']).replace(' ', '')}"
    full, second = inc["full"], inc["incremental"]
    return [
        target(f"incremental checkpoint, {size}, a tenth changed: bytes / first's",
               inc["written_ratio"], 0.15, "<=", "x", f"{human(second['written'])} vs {human(full['written'])}"),
        target(f"incremental checkpoint, {size}, a tenth changed: time / first's",
               inc["time_ratio"], 0.3, "<=", "x", f"{second['seconds']:.3f} s vs {full['seconds']:.3f} s"),
    ]


def device_targets(limits: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    dev_runs = [r for r in runs if r["kind"] == "device"]
    for dev in sorted({r["device_bytes"] for r in dev_runs}):
        d = human(dev).replace(" ", "")

        def get(op: str, storage: str, dev: int = dev) -> Optional[dict[str, Any]]:
            return next((r for r in dev_runs if r["device_bytes"] == dev and r["op"] == op
                         and r["storage"] == storage), None)

        ck, rs, ckt = get("checkpoint", "disk"), get("restore", "disk"), get("checkpoint", "tmpfs")
        if ck is not None:
            out.append(target(f"checkpoint to disk, D={d}: rate / fsync'd disk write", ck["ratio_to_limit"], 0.85,
                              ">=", "x", _against(ck, limits)))
        if rs is not None:
            out.append(target(f"restore from disk, D={d}: rate / cold disk read", rs["ratio_to_limit"], 0.85, ">=",
                              "x", _against(rs, limits)))
        if ckt is not None:
            out.append(target(f"checkpoint to tmpfs, D={d}: rate / tmpfs write", ckt["ratio_to_limit"], 0.85, ">=",
                              "x", f"{_against(ckt, limits)}; memcpy {human(limits['memcpy_Bps'])}/s"))
        ck = ck or ckt
        if ck is None:
            continue
        m = ck["memory"]
        out.append(target(f"extra host memory during checkpoint, D={d}", m["extra_total"] / MIB, 256, "<=", "MiB",
                          f"target +{human(m['target_extra'])}, npusnap {human(m['npusnap_peak_rss'])}, "
                          f"criu+guardian {human(m['children_peak_rss'])}, daemon +{human(m['daemon_growth'])}"))
        rm = (rs or get("restore", "tmpfs") or {}).get("memory")
        if rm:
            out.append(target(f"extra host memory during restore, D={d}", rm["extra_total"] / MIB, 256, "<=", "MiB",
                              f"npusnap {human(rm['npusnap_peak_rss'])}, criu+guardian {human(rm['children_peak_rss'])}"
                              f" (daemon +{human(rm['daemon_growth'])}: the device memory itself)"))
        disk = ck["disk"]
        nz = disk["device_nonzero"]
        out.append(target(f"device bytes on disk / non-zero device bytes, D={d}",
                          disk["device_on_disk"] / nz if nz else 0.0, 1.01, "<=", "x",
                          f"{human(disk['device_on_disk'])} on disk for {human(nz)} non-zero of {human(dev)}"))
    return out


def cpu_targets(cpus: list[dict[str, Any]], tiny: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for cpu in cpus:
        size = human(cpu["bytes"])
        sz = size.replace(" ", "")
        out.append(target(f"CPU-only checkpoint, S={sz}: npusnap / (bare criu dump + fsync)",
                          cpu["checkpoint_ratio_vs_criu_plus_fsync"], 1.10, "<=", "x",
                          f"{cpu['npusnap_checkpoint_s']:.3f} s vs {cpu['criu_checkpoint_plus_fsync_s']:.3f} s "
                          f"(bare alone: {cpu['criu_checkpoint_s']:.3f} s)"))
        out.append(target(f"CPU-only restore, S={sz}: npusnap / bare criu restore", cpu["restore_ratio"], 1.10, "<=",
                          "x", f"{cpu['npusnap_restore_s']:.3f} s vs {cpu['criu_restore_s']:.3f} s"))
        out.append(target(f"extra host memory during CPU-only checkpoint, S={sz}", cpu["npusnap_extra_memory"] / MIB,
                          256, "<=", "MiB", "target's growth + npusnap + criu + guardian (peaks)"))
        out.append(target(f"extra host memory during CPU-only restore, S={sz}",
                          cpu["npusnap_restore_extra_memory"] / MIB, 256, "<=", "MiB",
                          "npusnap + criu + guardian (peaks; the restored workload not counted)"))
    if tiny is not None:
        t = human(tiny["bytes"])
        out.append(target(f"tiny CPU-only checkpoint ({t}): npusnap - (bare criu dump + fsync)",
                          tiny["checkpoint_overhead_s"] * 1000, 50.0, "<=", "ms",
                          f"{tiny['npusnap_checkpoint_s']:.3f} s vs {tiny['criu_checkpoint_plus_fsync_s']:.3f} s; "
                          + _fixed_cost(tiny, "checkpoint")))
        out.append(target(f"tiny CPU-only restore ({t}): npusnap - bare criu restore",
                          tiny["restore_overhead_s"] * 1000, 50.0, "<=", "ms",
                          f"{tiny['npusnap_restore_s']:.3f} s vs {tiny['criu_restore_s']:.3f} s; "
                          + _fixed_cost(tiny, "restore")))
    return out


def _fixed_cost(tiny: dict[str, Any], op: str) -> str:
    """The tiny process's overhead as its fastest samples and its CPU time show it (less swayed by load)."""
    return (f"fastest samples {tiny[f'{op}_overhead_min_s'] * 1000:.0f} ms, CPU time "
            f"{tiny[f'npusnap_{op}_cpu_s'] * 1000:.0f} vs {tiny[f'criu_{op}_cpu_s'] * 1000:.0f} ms")


def machine(workdir: Path, tmpfs_dir: Path, preset: str, repeat: int) -> dict[str, Any]:
    from npusnap_cli import __version__

    from .util import fs_type

    def meminfo(key: str) -> int:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    cpu_model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.partition(":")[2].strip()
            break
    try:
        from npusnap_cli.platform.criu import find_criu

        criu_version = find_criu().version_str
    except Exception as e:  # recorded, not fatal: the CRIU runs would have failed already
        criu_version = f"unknown ({e})"
    return {
        "host": socket.gethostname(), "kernel": platform.release(), "cpu": cpu_model,
        "cpus": len(os.sched_getaffinity(0)), "memory_bytes": meminfo("MemTotal"),
        "load_avg": list(os.getloadavg()), "python": platform.python_version(),
        "npusnap": __version__, "criu": criu_version,
        "workdir": str(workdir), "workdir_fs": fs_type(workdir),
        "tmpfs_dir": str(tmpfs_dir), "tmpfs_fs": fs_type(tmpfs_dir),
        "preset": preset, "repeat": repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _fmt_value(t: dict[str, Any]) -> str:
    v = t["value"]
    if v is None:
        return "n/a"
    return f"{v:.3g} {t['unit']}" if t["unit"] != "x" else f"{v:.3f}x"


def print_tables(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(140, Console().width))
    lim = doc["limits"]
    t = Table(title="physical limits (median)", show_lines=False)
    for col in ("limit", "rate"):
        t.add_column(col)
    cold = "disk read, cold" + ("" if lim.get("disk_cache_evicted") else " (eviction failed!)")
    for key, label in (("memcpy_Bps", "memcpy, 1 thread"), ("disk_write_fsync_Bps", "disk write + fsync"),
                       ("disk_read_cold_Bps", cold),
                       ("tmpfs_write_Bps", "tmpfs write"), ("tmpfs_read_Bps", "tmpfs read")):
        t.add_row(label, f"{human(lim[key])}/s")
    console.print(t)

    t = Table(title="runs (median seconds; throughput = host+device bytes / wall time of the command)")
    for col in ("what", "op", "to", "state", "seconds", "rate", "x limit", "phases (s)"):
        t.add_column(col, overflow="fold")
    for r in doc["runs"]:
        what = "cpu-only " + r["tool"] if r["kind"] == "cpu-only" else f"device D={human(r['device_bytes'])}"
        ratio = r.get("ratio_to_limit")
        phases = " ".join(f"{k} {v:.2f}" for k, v in r.get("phases", {}).items())
        t.add_row(what, r["op"], r["storage"], human(r["state_bytes"]), f"{r['seconds']:.3f}",
                  f"{human(r['throughput_Bps'])}/s", f"{ratio:.2f}" if ratio is not None else "", phases)
    console.print(t)

    print_profile(console, doc["runs"])

    t = Table(title="targets")
    for col in ("target", "value", "goal", "met", "detail"):
        t.add_column(col, overflow="fold")
    for tg in doc["targets"]:
        goal = f"{tg['cmp']} {tg['goal']:g}{'x' if tg['unit'] == 'x' else ' ' + tg['unit']}"
        met = "[green]yes[/green]" if tg["met"] else "[red]NO[/red]"
        t.add_row(tg["name"], _fmt_value(tg), goal, met, tg["detail"])
    console.print(t)
    for section, why in (doc.get("skipped") or {}).items():
        console.print(f"skipped {section}: {why}")
    cut = (doc.get("budget") or {}).get("cut") or {}
    if cut:
        console.print("budget of {:.0f} s: fewer samples than planned in {}".format(
            doc["budget"]["seconds"], ", ".join(f"{k} ({v})" for k, v in cut.items())))
    inc = doc.get("incremental")
    if inc and "skipped" in inc:
        console.print(f"skipped incremental: {inc['skipped']}")
    elif inc:  # bench/incremental.py
        plain = f"; against a whole one without --dedup {inc['time_vs_plain']}" if inc.get("plain_s") else ""
        console.print(f"incremental (D={human(inc['device_bytes'])}, H={human(inc['host_bytes'])}, "
                      f"{inc['changed_fraction']:.0%} of each changed): second/first device bytes "
                      f"{inc['bytes_ratio']}, all bytes {inc['written_ratio']}, time {inc['time_ratio']} "
                      f"(checkpoint phases {inc['phases_time_ratio']}, backup {inc['backup_time_ratio']}{plain})")
    lz = doc.get("lazy_restore")
    if lz and "skipped" not in lz:  # bench/lazy.py
        from .lazy import row

        console.print(row(lz))
    met = sum(tg["met"] for tg in doc["targets"])
    console.print(f"{met}/{len(doc['targets'])} targets met; results in {doc.get('output', 'results.json')}")


def print_profile(console: Any, runs: list[dict[str, Any]]) -> None:
    """Per device run: each phase and step (phase/step) with its median seconds, bytes and rate;
    "cli" is the rest of the command's wall time (interpreter start-up, imports, exit)."""
    from rich.table import Table

    dev = [r for r in runs if r["kind"] == "device" and r.get("profile")]
    if not dev:
        return
    t = Table(title="device runs, per phase (median; phase/step: a step inside the phase)")
    for col in ("run", "phase", "seconds", "share", "bytes", "rate"):
        t.add_column(col, overflow="fold")
    for r in dev:
        label = f"{r['op']} D={human(r['device_bytes'])} H={human(r['host_bytes'])} -> {r['storage']}"
        rows = [*r["profile"].items(), ("cli", {"seconds": r["phases"].get("cli", 0.0), "bytes": 0.0})]
        for name, v in rows:
            secs, nbytes = v["seconds"], v["bytes"]
            rate = f"{human(nbytes / secs)}/s" if nbytes and secs > 0 else ""
            t.add_row(label, name, f"{secs:.3f}", f"{secs / r['seconds']:.0%}" if r["seconds"] else "",
                      human(nbytes) if nbytes else "", rate)
            label = ""
        t.add_row("", "total (wall)", f"{r['seconds']:.3f}", "", human(r["state_bytes"]),
                  f"{human(r['throughput_Bps'])}/s", end_section=True)
    console.print(t)


def _against(run: dict[str, Any], limits: dict[str, Any]) -> str:
    """A device run's rate against its limit: the one its samples measured on files of the image's
    size (the ratio is each sample's against its own), and the run's, on files of limits["bytes"]."""
    if "limit_Bps" not in run:  # a document from before the limits were measured per sample
        return f"{human(run['throughput_Bps'])}/s vs {human(limits[run['limit']])}/s"
    run_limit = limits[run["limit"]]
    return (f"{human(run['throughput_Bps'])}/s vs {human(run['limit_Bps'])}/s on "
            f"{human(run['limit_file_bytes'])} files in the same samples "
            f"({human(run_limit)}/s on {human(limits['bytes'])}: {run['throughput_Bps'] / run_limit:.2f}x)")


def plot(doc: dict[str, Any], path: Path) -> Optional[str]:
    """Throughput against size (checkpoint, restore) for npusnap, bare CRIU and the limits, and
    each device run's time per phase. Returns why nothing was drawn (matplotlib missing)."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return ("matplotlib is not installed: plot skipped (pip install matplotlib, "
                "or install npusnap with the `bench` extra)")
    runs = doc["runs"]
    lim = doc["limits"]
    fig = plt.figure(figsize=(15, 11))
    grid = fig.add_gridspec(2, 2)
    limit_lines = {"checkpoint": (("disk_write_fsync_Bps", "disk write + fsync", "--"),
                                  ("tmpfs_write_Bps", "tmpfs write", "-.")),
                   "restore": (("disk_read_cold_Bps", "disk cold read", ":"), ("tmpfs_read_Bps", "tmpfs read", "-."))}
    series = [  # (label, kind, tool, storage, marker)
        ("npusnap, device workload -> disk", "device", "npusnap", "disk", "o-"),
        ("npusnap, device workload -> tmpfs", "device", "npusnap", "tmpfs", "s-"),
        ("npusnap, CPU-only -> disk", "cpu-only", "npusnap", "disk", "^-"),
        ("bare CRIU, CPU-only -> disk", "cpu-only", "criu", "disk", "v--"),
        ("bare CRIU + fsync, CPU-only -> disk", "cpu-only", "criu+fsync", "disk", "x--"),
    ]
    for col, op in enumerate(("checkpoint", "restore")):
        ax = fig.add_subplot(grid[0, col])
        for label, kind, tool, storage, style in series:
            pts = sorted((r["state_bytes"], r["throughput_Bps"]) for r in runs
                         if r["kind"] == kind and r["tool"] == tool and r["op"] == op and r["storage"] == storage
                         and r["state_bytes"] >= MIB * 8)  # the tiny process measures fixed cost, not rate
            if pts:
                ax.plot([x / MIB for x, _ in pts], [y / MIB for _, y in pts], style, label=label)
        for storage, style in (("disk", "+:"), ("tmpfs", "x:")):  # each device run's own, at its image's size
            pts = sorted((r["state_bytes"], r["limit_Bps"]) for r in runs if r["kind"] == "device"
                         and r["op"] == op and r["storage"] == storage and "limit_Bps" in r)
            if pts:
                ax.plot([x / MIB for x, _ in pts], [y / MIB for _, y in pts], style, color="k",
                        label=f"limit at the image's size: {storage}")
        for key, label, style in limit_lines[op]:
            ax.axhline(lim[key] / MIB, linestyle=style, color="k", linewidth=1, label=f"limit: {label}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("state size, MiB (host RSS + device memory)")
        ax.set_ylabel("MiB/s (state bytes / wall time of the command)")
        ax.set_title(f"{op}: throughput against size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)

    # Bottom: stacked per-phase seconds, one bar per device run.
    ax = fig.add_subplot(grid[1, :])
    dev = sorted((r for r in runs if r["kind"] == "device"),
                 key=lambda r: (r["device_bytes"], r["storage"], r["op"]))
    phase_names = list(dict.fromkeys(n for r in dev for n in r["phases"]))
    x = list(range(len(dev)))
    bottoms = [0.0] * len(dev)
    cmap = plt.get_cmap("tab20")
    for i, n in enumerate(phase_names):
        vals = [r["phases"].get(n, 0.0) for r in dev]
        ax.bar(x, vals, bottom=bottoms, label=n, color=cmap(i % 20))
        bottoms = [a + b for a, b in zip(bottoms, vals)]
    ax.set_xticks(x, [f"D={human(r['device_bytes'])}\n{'ckpt' if r['op'] == 'checkpoint' else 'rest'}/"
                      f"{r['storage']}" for r in dev], fontsize=7)
    ax.set_ylabel("seconds (median)")
    ax.set_title("device workload: time per phase")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
