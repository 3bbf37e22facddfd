"""The benchmark's size sweep without running it: size lists, the guard that skips sizes the
machine cannot hold, targets from a sweep with skipped sizes, and the plot (drawn with
matplotlib, or skipped with a message without it). No root, no CRIU; no timing checked."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.config import GIB, MIB, PRESETS, parse_size, parse_sizes, with_sizes
from bench.util import mem_available, unfit


def test_size_lists_parse_in_binary_units_sorted_and_distinct() -> None:
    assert parse_size("64M") == 64 * MIB and parse_size("1GiB") == GIB and parse_size("1.5g") == 3 * GIB // 2
    assert parse_sizes("1G, 256m,64M,256MiB") == [64 * MIB, 256 * MIB, GIB]
    for bad in ("", "12 parsecs", "-1G", "100K"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_presets_sweep_and_a_list_replaces_the_presets() -> None:
    full = PRESETS["full"]
    assert full.cpu_bytes[0] == 64 * MIB and full.cpu_bytes[-1] == 4 * GIB
    assert full.device_bytes[0] == 256 * MIB and full.device_bytes[-1] == 8 * GIB
    mine = with_sizes(PRESETS["quick"], None, [512 * MIB])
    assert mine.device_bytes == [512 * MIB] and mine.cpu_bytes == PRESETS["quick"].cpu_bytes


def test_a_size_beyond_the_machine_is_refused_with_the_reason(tmp_path: Path) -> None:
    assert unfit(16 * MIB, 16 * MIB, tmp_path) is None
    why = unfit(mem_available() + GIB)
    assert why is not None and "memory" in why and "available" in why
    why = unfit(MIB, disk=1 << 60, disk_dir=tmp_path)
    assert why is not None and str(tmp_path) in why and "free" in why


def _run(op: str, storage: str, dev: int, kind: str = "device", tool: str = "npusnap") -> dict[str, Any]:
    state = 256 * MIB + dev
    run: dict[str, Any] = {"kind": kind, "tool": tool, "op": op, "storage": storage, "host_bytes": 256 * MIB,
                           "device_bytes": dev, "state_bytes": state, "seconds": 1.0, "samples": [1.0],
                           "throughput_Bps": float(state), "ratio_to_limit": 0.5,
                           "phases": {"dump": 0.5, "cli": 0.5}}
    if kind == "device":
        limit = {"checkpoint": "disk_write_fsync_Bps", "restore": "disk_read_cold_Bps"}[op] if storage == "disk" \
            else {"checkpoint": "tmpfs_write_Bps", "restore": "tmpfs_read_Bps"}[op]
        run.update({"limit": limit, "limit_Bps": 2.0 * state, "limit_samples": [2.0 * state],
                    "limit_file_bytes": state, "run_limit_Bps": 1e9})
        run["memory"] = ({"target_extra": MIB, "npusnap_peak_rss": 30 * MIB, "children_peak_rss": 30 * MIB,
                          "daemon_growth": MIB, "extra_total": 62 * MIB} if op == "checkpoint" else
                         {"npusnap_peak_rss": 30 * MIB, "children_peak_rss": 90 * MIB, "daemon_growth": dev,
                          "extra_total": 120 * MIB})
        if op == "checkpoint":
            run["disk"] = {"device_on_disk": dev // 2, "device_nonzero": dev // 2}
    return run


def _doc() -> dict[str, Any]:
    # D=256M measured on disk and tmpfs; D=8G only to tmpfs (its disk series was skipped).
    runs = [_run(op, st, 256 * MIB) for op in ("checkpoint", "restore") for st in ("disk", "tmpfs")]
    runs += [_run(op, "tmpfs", 8 * GIB) for op in ("checkpoint", "restore")]
    for tool in ("criu", "npusnap", "criu+fsync"):
        for op in ("checkpoint", "restore") if tool != "criu+fsync" else ("checkpoint",):
            runs.append(_run(op, "disk", 0, kind="cpu-only", tool=tool))
    lim = {"bytes": 256 * MIB, "memcpy_Bps": 8e9, "disk_write_fsync_Bps": 1e9, "disk_read_cold_Bps": 2e9,
           "tmpfs_write_Bps": 4e9, "tmpfs_read_Bps": 6e9}
    cpu = {"bytes": 256 * MIB, "checkpoint_ratio_vs_criu_plus_fsync": 1.2, "restore_ratio": 1.05,
           "npusnap_checkpoint_s": 1.2, "criu_checkpoint_plus_fsync_s": 1.0, "criu_checkpoint_s": 0.8,
           "npusnap_restore_s": 1.05, "criu_restore_s": 1.0, "npusnap_extra_memory": 90 * MIB,
           "npusnap_restore_extra_memory": 300 * MIB}
    ping = {"median_ms": 0.2, "p99_ms": 0.5, "count": 10}
    copy = {"bytes": 32 * MIB, "h2d_Bps": 6e9, "d2h_Bps": 6e9}
    return {"runs": runs, "limits": lim,
            "targets": report.targets(lim, [cpu], runs, ping, {"median_ms": 90.0, "count": 3}, copy)}


def test_targets_cover_each_measured_size_and_only_those() -> None:
    targets = {t["name"]: t for t in _doc()["targets"]}
    assert len(targets) == len(_doc()["targets"])
    assert targets["checkpoint to disk, D=256MiB: rate / fsync'd disk write"]["met"] is False
    assert "checkpoint to tmpfs, D=8GiB: rate / tmpfs write" in targets
    # each series is held to the limit its own samples measured at the image's size
    assert "files in the same samples" in targets["restore from disk, D=256MiB: rate / cold disk read"]["detail"]
    skipped = ("checkpoint to disk, D=8GiB", "restore from disk, D=8GiB")
    assert not any(n.startswith(skipped) for n in targets)  # skipped: no figure, not a failure
    assert targets["extra host memory during checkpoint, D=8GiB"]["value"] == 62
    assert targets["extra host memory during restore, D=256MiB"]["met"] is True
    assert targets["CPU-only checkpoint, S=256MiB: npusnap / (bare criu dump + fsync)"]["met"] is False
    assert targets["CPU-only restore, S=256MiB: npusnap / bare criu restore"]["met"] is True
    assert targets["extra host memory during CPU-only restore, S=256MiB"]["met"] is False
    assert all(math.isfinite(t["value"]) for t in targets.values())


def test_without_matplotlib_the_plot_is_skipped_with_a_message(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    msg = report.plot(_doc(), tmp_path / "results.png")
    assert msg is not None and "skipped" in msg and "matplotlib" in msg
    assert not (tmp_path / "results.png").exists()


def test_the_plot_is_drawn_with_matplotlib(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the `bench` extra) is not installed")
    png = tmp_path / "results.png"
    assert report.plot(_doc(), png) is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_the_profile_shows_each_phase_and_step_with_its_median_bytes_and_rate() -> None:
    """bench --profile: per device run, each phase and step (phase/step) of the command's --json
    with the median of its samples, its bytes and rate, and the rest of the wall time as cli."""
    from rich.console import Console

    from bench.__main__ import parse
    from bench.device import _median_profile, _profile

    def sample(export_s: float) -> dict[str, Any]:
        return _profile({"phases": [
            {"name": "backup", "seconds": export_s + 0.1, "bytes": GIB,
             "parts": {"export": {"seconds": export_s, "bytes": 768 * MIB}}},
            {"name": "dump", "seconds": 2.0, "bytes": GIB},
        ]})

    prof = _median_profile([sample(1.0), sample(3.0), sample(2.0)])
    assert prof["backup/export"] == {"seconds": 2.0, "bytes": 768 * MIB}
    assert prof["backup"]["seconds"] == 2.1 and prof["dump"]["bytes"] == GIB
    run = {"kind": "device", "op": "checkpoint", "storage": "tmpfs", "device_bytes": GIB, "host_bytes": GIB,
           "state_bytes": 2 * GIB, "seconds": 5.0, "throughput_Bps": 2 * GIB / 5.0,
           "phases": {"backup": 2.1, "dump": 2.0, "cli": 0.9}, "profile": prof}
    console = Console(record=True, width=200)
    report.print_profile(console, [run, {"kind": "cpu-only"}])
    text = console.export_text()
    assert "backup/export" in text and "384 MiB/s" in text  # 768 MiB in 2 s
    assert "cli" in text and "0.900" in text and "total (wall)" in text
    args = parse(["--profile", "--host-sizes", "256M"])
    assert args.profile and args.host_sizes == [256 * MIB]
    assert PRESETS["profile"].device_bytes == [GIB] and PRESETS["profile"].cpu_bytes == []
