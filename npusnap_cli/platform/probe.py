"""What this machine offers for checkpointing: CRIU, kernel features, privileges, devices."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import native
from ..errors import NpusnapError

CAP_SYS_PTRACE = 19
CAP_CHECKPOINT_RESTORE = 40


@dataclass
class Item:
    name: str
    status: str            # ok | warn | fail | info
    detail: str
    fix: Optional[str] = None


@dataclass
class Report:
    items: list[Item] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(i.status != "fail" for i in self.items)

    def add(self, *args: Any, **kw: Any) -> None:
        self.items.append(Item(*args, **kw))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [asdict(i) for i in self.items]}


def effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _criu(report: Report, criu_path: Optional[str]) -> None:
    from .criu import INSTALL_HINT, Criu, find_criu

    try:
        binary = find_criu(criu_path)
    except NpusnapError as e:
        report.add("criu", "fail", e.message, e.hint)
        return
    report.add("criu", "ok", f"CRIU {binary.version_str} at {binary.path}")
    try:
        good, verdict = Criu(binary).check()
    except NpusnapError as e:
        good, verdict = False, e.message
    report.add("criu check", "ok" if good else "fail", verdict,
               None if good else "see `criu check --all`; " + INSTALL_HINT)
    try:
        feats = Criu(binary).features()
    except NpusnapError:
        feats = {}
    _network_lock(report, binary.path)
    _kernel_cache(report, binary.path)
    for key, label, use in (("mem_track", "soft-dirty tracking", "incremental (pre-dump) checkpoints"),
                            ("lazy_pages", "userfaultfd", "lazy (post-copy) restore")):
        if key in feats:
            report.add(label, "ok" if feats[key] else "info",
                       "available" if feats[key] else f"not available (only {use} need it)")


def fs_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> Optional[str]:
    """The type of the file system path lies on (its deepest mount point), None if unknown."""
    best, kind = -1, None
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = parts[4]  # octal escapes (\040 for a space) left: no path we ask about has one
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the later of two mounts on one point is the visible one
            best, kind = len(point), rest.split()[0]
    return kind


def _kernel_cache(report: Report, criu_binary: str) -> None:
    """CRIU probes the kernel's features on every call (~40 ms of a checkpoint or restore on a
    2-core machine) unless it kept them in /run/criu.kdat, which it does on a tmpfs only. A CRIU
    with npusnap's patch runs them while npusnap starts (criustart.py), off the critical path."""
    from .criustart import probes_early

    kind = fs_type("/run")
    if kind == "tmpfs":
        report.add("criu kernel cache", "ok", "/run is a tmpfs: CRIU keeps its kernel probes (/run/criu.kdat)")
        return
    detail = (f"/run is {kind or 'of an unknown type'}, not a tmpfs: CRIU probes the kernel again on every "
              "checkpoint and restore (tens of ms each)")
    if probes_early(criu_binary):
        report.add("criu kernel cache", "info", detail + "; this CRIU runs them while npusnap starts")
    else:
        report.add("criu kernel cache", "info", detail, "mount a tmpfs on /run, as systemd does, or build CRIU "
                   "with npusnap's patches (scripts/install-criu.sh): it probes while npusnap starts")


def _network_lock(report: Report, criu_binary: str) -> None:
    """Which way CRIU can lock TCP connections while it dumps them (--tcp-established)."""
    from ..netlock import methods

    found = methods(criu_binary)
    works = [m for m in found if m.works and m.name != "skip"]
    others = "; ".join(f"{m.name}: {m.detail}" for m in found if m.name != "skip" and not m.works)
    if works:
        detail = f"{works[0].name} ({works[0].detail}); --network-lock auto uses it"
        report.add("network lock", "ok", detail + (f"; {others}" if others else ""))
    else:
        report.add("network lock", "warn", f"no method works ({others}); --tcp-established dumps unlocked",
                   "install iptables, or use a CRIU built with libnftables")


def _kernel(report: Report) -> None:
    has_cr = Path("/proc/sys/kernel/ns_last_pid").exists() and Path("/proc/self/map_files").exists()
    report.add("kernel", "ok" if has_cr else "fail",
               f"Linux {platform.release()}, CONFIG_CHECKPOINT_RESTORE " + ("on" if has_cr else "off"),
               None if has_cr else "use a kernel built with CONFIG_CHECKPOINT_RESTORE=y")


def _privileges(report: Report) -> None:
    caps = effective_caps()
    root = os.geteuid() == 0
    cr = bool(caps & (1 << CAP_CHECKPOINT_RESTORE))
    ptrace = bool(caps & (1 << CAP_SYS_PTRACE))
    detail = (f"euid {os.geteuid()}; CAP_CHECKPOINT_RESTORE {'yes' if cr else 'no'}; "
              f"CAP_SYS_PTRACE {'yes' if ptrace else 'no'}")
    good = root or (cr and ptrace)
    report.add("privileges", "ok" if good else "fail", detail,
               None if good else "run as root, or grant CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE")


def _devices(report: Report) -> None:
    sim = native.NPUSIMD.exists() and native.RUNTIME_LIB.exists()
    report.add("device: sim", "ok" if sim else "warn",
               f"npusim built at {native.NATIVE_DIR}" if sim else "npusim is not built in this install",
               None if sim else "reinstall npusnap with `pip install .`")
    agent = native.AGENT_LIB.exists()
    report.add("agent", "ok" if agent else "warn",
               f"{native.AGENT_LIB}" if agent else "agent library missing", None if agent else "reinstall npusnap")
    home = os.environ.get("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/ascend-toolkit/latest")
    real = Path(home, "lib64", "libascendcl.so").exists() and not Path(home).resolve().is_relative_to(
        native.NATIVE_DIR.resolve())
    report.add("device: ascend", "ok" if real else "info",
               f"CANN runtime at {home}" if real else "no CANN runtime found (Ascend NPUs unavailable)")
    from . import cuda

    status, detail, fix, _ = cuda.probe()  # NPUSNAP_LIBCUDA, default libcuda.so.1
    report.add("device: cuda", status, detail, fix)


def probe(criu_path: Optional[str] = None) -> Report:
    report = Report()
    _criu(report, criu_path)
    _kernel(report)
    _privileges(report)
    _devices(report)
    return report
