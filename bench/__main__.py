"""python -m bench [--quick | --profile | --sizes tiny|quick|full|profile] [--host-sizes 64M,1G]
                   [--device-sizes 256M,8G] [--dir DIR] [--output FILE]"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from . import copies, cpuonly, device, incremental, latency, lazy, limits, live, report
from .config import PRESETS, Sizes, human, parse_sizes, with_sizes
from .util import BENCH_DIR, BenchError, Budget, Resources, become_subreaper


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").strip())
    ap.add_argument("--quick", action="store_true", help="the quick preset (256 MiB; under 2 minutes)")
    ap.add_argument("--profile", action="store_true",
                    help="only the device workload (1 GiB host, or --host-sizes' first, + 1 GiB device, or "
                         "--device-sizes): each phase's and step's seconds and bytes")
    ap.add_argument("--sizes", choices=sorted(PRESETS),
                    help="size preset (default: full, quick with --quick, profile with --profile)")
    ap.add_argument("--host-sizes", type=_sizes, metavar="LIST",
                    help="host RSS of the CPU-only process, swept (e.g. 64M,256M,1G,4G; default: the preset's)")
    ap.add_argument("--device-sizes", type=_sizes, metavar="LIST",
                    help="device memory of the device workload, swept (e.g. 256M,1G,8G; default: the preset's)")
    ap.add_argument("--repeat", type=int, help="samples per measurement (median reported)")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                    help="where the disk measurements and checkpoints go (a private directory is made there)")
    ap.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"), help="a tmpfs for the in-memory measurements")
    ap.add_argument("--output", type=Path, default=BENCH_DIR / "results.json")
    ap.add_argument("--plot", dest="plot", action="store_true", default=None, help="draw results.png (full: on)")
    ap.add_argument("--no-plot", dest="plot", action="store_false")
    ap.add_argument("--budget", type=float, metavar="SECONDS",
                    help="wall-clock budget: samples beyond the first are cut to fit (default: the preset's; 0: none)")
    return ap.parse_args(argv)


def _sizes(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    preset = args.sizes or ("quick" if args.quick else "profile" if args.profile else "full")
    sizes = with_sizes(PRESETS[preset], args.host_sizes, args.device_sizes)
    if args.profile:  # --host-sizes names the device workload's host memory then
        host = args.host_sizes[0] if args.host_sizes else sizes.host_bytes
        sizes = replace(sizes, cpu_bytes=[], host_bytes=host, plot=False)
    repeat = args.repeat or sizes.repeat
    do_plot = sizes.plot if args.plot is None else args.plot
    if os.geteuid() != 0:
        print("bench: CRIU needs root; run as root", file=sys.stderr)
        return 2
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    from npusnap_cli.platform.criu import find_criu

    criu = find_criu().path
    become_subreaper()
    try:
        with Resources() as res:
            workdir = res.mkdtemp(args.dir, "npusnap-bench-")
            tmpfs_dir = res.mkdtemp(args.tmpfs, "npusnap-bench-")
            progress(f"preset {sizes.name}: CPU-only {_list(sizes.cpu_bytes)}, device {_list(sizes.device_bytes)} "
                     f"(+{human(sizes.host_bytes)} host); {repeat} samples each; work in {workdir} and {tmpfs_dir}")

            budget_s = sizes.budget if args.budget is None else (args.budget or None)
            budget = Budget(budget_s, [("limits", 4 * sizes.limit_bytes),
                                       *((cpuonly.section_name(n), cpuonly.weight(n)) for n in sizes.cpu_bytes),
                                       ("cpu-only-tiny", cpuonly.weight(sizes.tiny_bytes)),
                                       *device.sections(sizes.host_bytes, sizes.device_bytes),
                                       ("latency", 256 << 20)])
            progress(f"physical limits ({human(sizes.limit_bytes)} buffers/files)")
            lim = limits.measure(workdir, tmpfs_dir, sizes.limit_bytes, repeat)

            doc = (profile_run if args.profile else full_run)(res, criu, workdir, tmpfs_dir, sizes, repeat, lim,
                                                              budget, progress)
            doc["machine"] = report.machine(workdir, tmpfs_dir, sizes.name, repeat)
            doc["budget"] = {"seconds": budget_s, "cut": budget.cut}
            doc["duration_s"] = round(time.monotonic() - started, 1)
    except KeyboardInterrupt:
        print("bench: interrupted; everything it started was stopped and removed", file=sys.stderr)
        return 130
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    report.write_json(args.output, doc)
    doc["output"] = str(args.output)
    report.print_tables(doc)
    if do_plot:
        png = args.output.with_suffix(".png")
        msg = report.plot(doc, png)
        print(f"bench: {msg}" if msg else f"bench: plot in {png}", file=sys.stderr)
    progress("done")
    return 0


def profile_run(res: Resources, criu: str, workdir: Path, tmpfs_dir: Path, sizes: Sizes, repeat: int,
                lim: dict[str, Any], budget: Budget, progress: Any) -> dict[str, Any]:
    """--profile: the device workload only (its per-phase breakdown is the point)."""
    runs, skipped = device.measure(res, workdir, tmpfs_dir, sizes.host_bytes, sizes.device_bytes, repeat,
                                   sizes.zero_fraction, lim, budget, progress)
    return {"targets": report.device_targets(lim, runs), "limits": lim, "runs": runs, "skipped": skipped}


def full_run(res: Resources, criu: str, workdir: Path, tmpfs_dir: Path, sizes: Sizes, repeat: int,
             lim: dict[str, Any], budget: Budget, progress: Any) -> dict[str, Any]:
    cpus, skipped = cpuonly.sweep(res, criu, workdir, sizes.cpu_bytes, repeat, budget, progress)
    progress(f"tiny CPU-only process ({human(sizes.tiny_bytes)} of data): npusnap's fixed cost over bare criu")
    tiny = cpuonly.measure(res, criu, workdir, sizes.tiny_bytes, repeat, budget, section="cpu-only-tiny")

    dev_runs, dev_skipped = device.measure(res, workdir, tmpfs_dir, sizes.host_bytes, sizes.device_bytes,
                                           repeat, sizes.zero_fraction, lim, budget, progress)
    skipped.update(dev_skipped)

    incr_dev, incr_host = sizes.incremental
    progress(f"incremental: {human(incr_dev)} device + {human(incr_host)} host memory, a tenth of each changed, "
             "checkpointed twice (--parent, --dedup)")
    why = incremental.fits(workdir, incr_dev, incr_host)
    incr = {"skipped": why} if why else incremental.measure(res, workdir, incr_dev, incr_host)

    live_bytes = sizes.live_bytes
    progress(f"live: {human(live_bytes)} of device memory, downtime of --live vs a full --leave-running")
    live_run = live.measure(res, workdir, tmpfs_dir, min(sizes.host_bytes, 64 << 20), live_bytes, min(repeat, 2))

    lazy_host, lazy_dev = min(sizes.host_bytes, 256 << 20), min(sizes.limit_bytes, 1 << 30)
    progress(f"lazy restore: {human(lazy_host)} host + {human(lazy_dev)} device, first step after it "
             "(python -m bench.lazy for a bigger job)")
    why = lazy.fits(workdir, lazy_host, lazy_dev)
    lazy_doc = {"skipped": why} if why else lazy.measure(res, workdir, lazy_host, lazy_dev, repeat)

    progress(f"npusim host<->device copies of {human(sizes.limit_bytes)}")
    copy = copies.measure(res, workdir, sizes.limit_bytes, repeat)

    progress(f"agent round trip x{sizes.pings}, `npusnap --help` x{sizes.helps}")
    ping = latency.agent_round_trip(res, workdir, sizes.pings)
    helps = latency.help_latency(sizes.helps)

    runs: list[dict[str, Any]] = [r for c in cpus for r in c.pop("runs")] + tiny.pop("runs") + dev_runs
    return {
        "targets": report.targets(lim, cpus, runs, ping, helps, copy, tiny, live_run, incr),
        "limits": lim,
        "runs": runs,
        "skipped": skipped,
        "cpu_only": cpus,
        "cpu_only_tiny": tiny,
        "latency": {"agent_ping": ping, "help": helps},
        "npusim_copies": copy,
        "incremental": incr,
        "live": live_run,
        "lazy_restore": lazy_doc,
    }


def _list(sizes: list[int]) -> str:
    return ", ".join(human(n) for n in sizes) or "none"


if __name__ == "__main__":
    sys.exit(main())
