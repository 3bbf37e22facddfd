"""CRIU's own options that real processes need (unlinked files, ghost files, outside
sockets, TCP, the network lock, external resources, inherited fds, cgroups, inotify
path resolution): one typed model.

Checkpoint records what it used in the manifest's options, and restore takes the
same from there, so a checkpoint restores with what it was dumped with; restore may
add its own restore-side ones (--tcp-close, --external, --inherit-fd).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any, Optional

from .errors import ImageInvalid

NETWORK_LOCKS = ("iptables", "nftables", "skip")
# CRIU's --manage-cgroups modes, as the RPC's criu_cg_mode names them ("soft": the flag alone).
CGROUP_MODES = {"none": "CG_NONE", "props": "PROPS", "soft": "SOFT", "full": "FULL", "strict": "STRICT",
                "ignore": "IGNORE"}
GHOST_LIMIT_MAX = (1 << 32) - 1  # CriuOpts.ghost_limit is a uint32
_INHERIT = re.compile(r"^fd\[(\d+)\]:(.+)$", re.S)


@dataclass(frozen=True)
class InheritFd:
    """`fd[N]:KEY`: CRIU restores the resource KEY (as `criu dump` named it) from our fd N."""

    fd: int
    key: str

    @classmethod
    def parse(cls, text: str) -> "InheritFd":
        m = _INHERIT.match(text)
        if not m:
            raise ValueError(f"{text!r} is not fd[N]:RESOURCE (e.g. 'fd[3]:pipe:[12345]')")
        fd = int(m.group(1))
        try:
            os.fstat(fd)
        except OSError:
            raise ValueError(f"{text!r}: fd {fd} is not open in npusnap (open it, e.g. `3<file`)") from None
        return cls(fd, m.group(2))


@dataclass(frozen=True)
class CriuOptions:
    """CRIU's options for the resources a tree holds (files, sockets, TCP, namespaces, cgroups)."""

    link_remap: bool = False         # link unlinked-but-open files back in place until restore
    ghost_limit: Optional[int] = None  # bytes of deleted files' contents kept in the image (CRIU: 1 MiB)
    ext_unix_sk: bool = False        # allow Unix sockets connected to a peer outside the tree
    tcp_close: bool = False          # established TCP: not dumped, restored closed
    skip_in_flight: bool = False     # ignore TCP connections not yet accepted
    network_lock: Optional[str] = None  # iptables | nftables | skip (None: CRIU's default, iptables)
    external: tuple[str, ...] = ()   # resources that live outside the tree (CRIU's --external)
    inherit_fd: tuple[InheritFd, ...] = ()  # restore only: never recorded
    manage_cgroups: Optional[str] = None  # a CGROUP_MODES key (None: CRIU's default); restore reuses the dump's
    cgroup_root: tuple[str, ...] = ()  # [CONTROLLER:]PATH: the tree's root cgroup (each side its own)
    cgroup_yard: Optional[str] = None  # where CRIU mounts the cgroup hierarchies (each side its own)
    force_irmap: bool = False        # dump: resolve inotify/fanotify watches to paths even when not needed
    irmap_scan_path: tuple[str, ...] = ()  # dump: where to look for those paths
    join_ns: tuple[str, ...] = ()    # restore only: NS:FILE[,EXTRA], restore into an existing namespace

    def apply(self, opts: Any, rpc: Any) -> tuple[int, ...]:
        """Set these on a CriuOpts message; returns the fds CRIU must inherit."""
        opts.link_remap = self.link_remap
        if self.ghost_limit is not None:
            opts.ghost_limit = self.ghost_limit
        opts.ext_unix_sk = self.ext_unix_sk
        opts.tcp_close = self.tcp_close
        opts.tcp_skip_in_flight = self.skip_in_flight
        if self.network_lock is not None:
            opts.network_lock = {"iptables": rpc.IPTABLES, "nftables": rpc.NFTABLES,
                                 "skip": rpc.SKIP}[self.network_lock]
        opts.external.extend(self.external)
        for item in self.inherit_fd:
            opts.inherit_fd.add(key=item.key, fd=item.fd)
        self._apply_cgroups_irmap(opts, rpc)
        return tuple(dict.fromkeys(i.fd for i in self.inherit_fd))

    def _apply_cgroups_irmap(self, opts: Any, rpc: Any) -> None:
        if self.manage_cgroups is not None:
            opts.manage_cgroups_mode = getattr(rpc, CGROUP_MODES[self.manage_cgroups])
        for root in self.cgroup_root:
            ctrl, _, path = root.partition(":") if ":" in root else ("", "", root)  # CRIU splits at the first
            item = opts.cg_root.add(path=path)
            if ctrl:
                item.ctrl = ctrl
        if self.cgroup_yard is not None:
            opts.cgroup_yard = self.cgroup_yard
        if self.force_irmap:
            opts.force_irmap = True
        opts.irmap_scan_paths.extend(self.irmap_scan_path)
        for item in self.join_ns:
            ns, _, rest = item.partition(":")
            ns_file, _, extra = rest.partition(",")  # as CRIU's own --join-ns parser splits it
            join = opts.join_ns.add(ns=ns, ns_file=ns_file)
            if extra:
                join.extra_opt = extra

    def recorded(self) -> dict[str, Any]:
        """The manifest's share: what restore must use again."""
        out: dict[str, Any] = {"link_remap": self.link_remap, "ext_unix_sk": self.ext_unix_sk,
                               "tcp_close": self.tcp_close, "skip_in_flight": self.skip_in_flight,
                               "external": list(self.external)}
        if self.ghost_limit is not None:
            out["ghost_limit"] = self.ghost_limit
        if self.network_lock is not None:
            out["network_lock"] = self.network_lock
        if self.manage_cgroups is not None:
            out["manage_cgroups"] = self.manage_cgroups
        return out

    @classmethod
    def from_manifest(cls, options: dict[str, Any]) -> "CriuOptions":
        """What the dump used; checkpoints written before these options existed have none."""
        lock = options.get("network_lock")
        external = options.get("external") or []
        ghost = options.get("ghost_limit")
        if lock is not None and lock not in NETWORK_LOCKS:
            raise ImageInvalid(f"manifest: unknown network_lock {lock!r}")
        if not isinstance(external, list) or not all(isinstance(e, str) for e in external):
            raise ImageInvalid("manifest: external must be a list of strings")
        if ghost is not None and (not isinstance(ghost, int) or isinstance(ghost, bool) or ghost < 0):
            raise ImageInvalid(f"manifest: bad ghost_limit {ghost!r}")
        cgroups = options.get("manage_cgroups")
        if cgroups is not None and cgroups not in CGROUP_MODES:
            raise ImageInvalid(f"manifest: unknown manage_cgroups {cgroups!r}")
        return cls(link_remap=bool(options.get("link_remap")), ghost_limit=ghost,
                   ext_unix_sk=bool(options.get("ext_unix_sk")), tcp_close=bool(options.get("tcp_close")),
                   skip_in_flight=bool(options.get("skip_in_flight")), network_lock=lock,
                   external=tuple(external), manage_cgroups=cgroups)

    def for_restore(self, ours: "CriuOptions") -> "CriuOptions":
        """These (the dump's), plus what restore's own flags (ours) add or choose."""
        return replace(self, tcp_close=self.tcp_close or ours.tcp_close,
                       external=tuple(dict.fromkeys((*self.external, *ours.external))), inherit_fd=ours.inherit_fd,
                       manage_cgroups=ours.manage_cgroups or self.manage_cgroups, cgroup_root=ours.cgroup_root,
                       cgroup_yard=ours.cgroup_yard, force_irmap=False, irmap_scan_path=(), join_ns=ours.join_ns)


def parse_ghost_limit(text: "str | int") -> int:
    from .platform.simdaemon import parse_size

    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        try:
            value = parse_size(str(text)) if str(text).strip() not in ("0",) else 0
        except OverflowError:
            raise ValueError(f"not a size: {text!r}") from None
    if not 0 <= value <= GHOST_LIMIT_MAX:
        raise ValueError(f"ghost limit {text!r} is out of range (0 to 4G-1)")
    return value


def check_external(items: tuple[str, ...]) -> tuple[str, ...]:
    """CRIU's --external RES: `KIND[ID]` or `KIND[ID]:VALUE` (unix[ino], tty[rdev:dev], file[mnt:ino], ...)."""
    for item in items:
        if not re.match(r"^[a-z]+\[[^\]]+\](:.+)?$", item, re.S):
            raise ValueError(f"{item!r} is not KIND[ID] or KIND[ID]:VALUE (e.g. 'unix[12345]', 'tty[8800:d]')")
    return items


def check_cgroup_root(items: tuple[str, ...]) -> tuple[str, ...]:
    """CRIU's --cgroup-root [CONTROLLER:]PATH: PATH absolute (e.g. '/newroot', 'name=zdtmtst:/prefix')."""
    for item in items:
        path = item.partition(":")[2] if ":" in item else item
        if not path.startswith("/"):
            raise ValueError(f"{item!r} is not [CONTROLLER:]/PATH (e.g. '/job1', 'cpu,cpuacct:/job1')")
    return items


def check_join_ns(items: tuple[str, ...]) -> tuple[str, ...]:
    """CRIU's --join-ns NS:FILE[,EXTRA] (e.g. 'net:/var/run/netns/blue', 'user:PID,UID,GID')."""
    for item in items:
        ns, _, ns_file = item.partition(":")
        if not re.match(r"^[a-z]+$", ns) or not ns_file.partition(",")[0]:
            raise ValueError(f"{item!r} is not NS:FILE[,EXTRA] (e.g. 'net:/var/run/netns/blue')")
    return items
