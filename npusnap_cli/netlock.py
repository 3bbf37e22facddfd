"""The network lock CRIU holds on TCP connections while it dumps them: which method
works on this machine (iptables, nftables, or none), and undoing it for a tree that
runs on after the dump.

CRIU unlocks the network only when it resumes the tree itself. npusnap dumps with the
tree left stopped (it resumes it only once the checkpoint is committed, or on
rollback), and then CRIU leaves the dumped TCP sockets in repair mode and its lock
rules in place, as it must for a restore: a tree resumed like that has dead
connections. `release` does what CRIU's own unlock would have done.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .criuopts import NETWORK_LOCKS
from .errors import EnvironmentProblem

TCP_REPAIR = 19  # linux/tcp.h; not in Python's socket module
TCP_REPAIR_OFF = 0
SYS_PIDFD_GETFD = 438  # x86_64 and the generic table alike
TCP_STATES_DUMPED = {1, 4, 5, 8, 9, 11, 2}  # ESTABLISHED FIN_WAIT1/2 CLOSE_WAIT LAST_ACK CLOSING SYN_SENT


@dataclass
class Method:
    name: str
    works: bool
    detail: str


def _nft_lib() -> Optional[ctypes.CDLL]:
    try:
        lib = ctypes.CDLL("libnftables.so.1")
    except OSError:
        return None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


def nft(command: str) -> tuple[bool, str]:
    """Run one nftables command through libnftables (the library CRIU itself uses;
    no `nft` binary needed). Returns (success, error text)."""
    lib = _nft_lib()
    if lib is None:
        return False, "libnftables is not installed"
    ctx = lib.nft_ctx_new(0)
    if not ctx:
        return False, "nft_ctx_new failed"
    try:
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        rc = lib.nft_run_cmd_from_buffer(ctx, command.encode())
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace").strip()
        return rc == 0, " ".join(err.split())
    finally:
        lib.nft_ctx_free(ctx)


def _criu_has_nftables(criu_binary: str) -> bool:
    """Whether this CRIU was built with libnftables (it links the library then)."""
    try:
        with open(criu_binary, "rb") as f:
            return b"libnftables.so" in f.read()
    except OSError:
        return False


def methods(criu_binary: str) -> list[Method]:
    """Each lock method and whether it works here, in the order `auto` prefers them."""
    out = []
    tool = shutil.which("iptables-restore")
    if tool is None or shutil.which("iptables") is None:
        out.append(Method("iptables", False, "iptables-restore is not installed"))
    else:
        try:
            r = subprocess.run(["iptables", "-w", "-L", "-n"], capture_output=True, text=True, timeout=20,
                               stdin=subprocess.DEVNULL)
            ok, why = r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, why = False, str(e)
        out.append(Method("iptables", ok, f"{tool}" if ok else f"iptables does not work: {why}"))
    if not _criu_has_nftables(criu_binary):
        out.append(Method("nftables", False, "this CRIU was built without libnftables"))
    else:
        ok, why = nft("list tables")
        out.append(Method("nftables", ok, "libnftables (CRIU's own)" if ok else f"nftables does not work: {why}"))
    out.append(Method("skip", True, "no lock: packets may reach a connection while it is dumped"))
    return out


def choose(explicit: Optional[str], criu_binary: str) -> str:
    """The method to dump with: the one asked for (which must work), else the first that works."""
    found = methods(criu_binary)
    if explicit:
        if explicit not in NETWORK_LOCKS:
            raise EnvironmentProblem(f"unknown network lock {explicit!r}")
        m = next(m for m in found if m.name == explicit)
        if not m.works:
            alt = next((x.name for x in found if x.works and x.name != "skip"), "skip")
            raise EnvironmentProblem(f"network lock {explicit} cannot work here: {m.detail}",
                                     f"use --network-lock {alt} (`npusnap check` shows what works)")
        return explicit
    return next(m.name for m in found if m.works)


# ---------------------------------------------------------------- unlocking a resumed tree


@dataclass
class Connection:
    ino: int
    family: str      # INET | INET6
    src: str
    sport: int
    dst: str
    dport: int
    reuseaddr: bool


def dumped_connections(images_dir: Path) -> list[Connection]:
    """The TCP connections CRIU dumped (and so locked) in this image."""
    from .platform.criuimages import holds_inet_sockets

    out: list[Connection] = []
    path = images_dir / "files.img"
    if not holds_inet_sockets(images_dir):  # most dumps: decided without pycriu (~40 ms to import)
        return out
    from pycriu import images

    with open(path, "rb") as f:
        entries = images.load(f)["entries"]
    for e in entries:
        sk = e.get("isk") if e.get("type") == "INETSK" else None
        if not sk or sk.get("proto") not in ("TCP", 6) or sk.get("state") not in TCP_STATES_DUMPED:
            continue
        family = "INET6" if sk.get("family") in (10, "INET6") else "INET"
        out.append(Connection(int(sk["ino"]), family, _addr(sk.get("src_addr")),
                              int(sk.get("src_port", 0)), _addr(sk.get("dst_addr")), int(sk.get("dst_port", 0)),
                              bool(sk.get("opts", {}).get("reuseaddr"))))
    return out


def _addr(value: Any) -> str:
    """An address as the image holds it: u32 words in network byte order (or text, from newer pycriu)."""
    words = value if isinstance(value, list) else [value]
    if words and all(isinstance(w, str) for w in words):
        return str(words[0])
    raw = b"".join(struct.pack("<I", int(w)) for w in words)
    if len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        raw = raw[12:]  # IPv4-mapped
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def dump_run_id(images_dir: Path) -> Optional[str]:
    from pycriu import images

    try:
        with open(images_dir / "inventory.img", "rb") as f:
            run_id = images.load(f)["entries"][0].get("dump_criu_run_id")
    except (OSError, KeyError, IndexError):
        return None
    return str(run_id) if run_id else None


def nft_table(run_id: str) -> str:
    """CRIU's lock table for a dump: it formats the name into a 32-byte buffer (netfilter.c)."""
    return f"inet CRIU-{run_id}"[:31]


def release(images_dir: Path, method: Optional[str], pids: list[int],
            warn: Callable[[str], None] = lambda m: None) -> None:
    """Before the dumped tree runs on: its TCP sockets out of repair mode, CRIU's lock gone."""
    conns = dumped_connections(images_dir)
    if conns:
        left = _repair_off(pids, {c.ino: c for c in conns})
        for c in left:
            warn(f"TCP connection {c.src}:{c.sport} -> {c.dst}:{c.dport} was not found in the tree; "
                 "it stays locked")
    _drop_rules(images_dir, method, conns, warn)


def drop_lock(images_dir: Path, method: Optional[str], warn: Callable[[str], None] = lambda m: None) -> None:
    """CRIU's lock rules for the connections this dump locked, without touching sockets: after a
    restore that closed them (CRIU's --tcp-close), for which CRIU unlocks nothing itself."""
    _drop_rules(images_dir, method, dumped_connections(images_dir), warn)


def _drop_rules(images_dir: Path, method: Optional[str], conns: list[Connection],
                warn: Callable[[str], None]) -> None:
    method = method or "iptables"  # CRIU's default
    if method == "nftables":
        run_id = dump_run_id(images_dir)
        if run_id:
            table = nft_table(run_id)
            ok, why = nft(f"delete table {table}")
            if not ok and "No such file" not in why:
                warn(f"could not remove CRIU's nftables table {table}: {why}")
    elif method == "iptables":
        for c in conns:
            _iptables_unlock(c, warn)


def _repair_off(pids: list[int], wanted: dict[int, Connection]) -> list[Connection]:
    """Take each wanted socket (by inode) out of TCP repair mode, as CRIU's unlock does;
    returns those not found in any of pids."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    done: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            for name in fds:
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{name}")
                except OSError:
                    continue
                if not link.startswith("socket:["):
                    continue
                ino = int(link[8:-1])
                if ino not in wanted or ino in done:
                    continue
                fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
                if fd < 0:
                    continue
                with contextlib.closing(socket.socket(fileno=fd)) as sk:
                    with contextlib.suppress(OSError):
                        if sk.getsockopt(socket.IPPROTO_TCP, TCP_REPAIR):
                            sk.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, TCP_REPAIR_OFF)
                            # Leaving repair mode resets SO_REUSEADDR: put back what the process had.
                            sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(wanted[ino].reuseaddr))
                    done.add(ino)
        finally:
            os.close(pidfd)
    return [c for ino, c in wanted.items() if ino not in done]


def _iptables_unlock(c: Connection, warn: Callable[[str], None]) -> None:
    """Delete the two DROP rules CRIU inserted for this connection (its IPTABLES_CONN_CMD)."""
    tool = "ip6tables" if ":" in c.src else "iptables"
    src, dst = c.src, c.dst
    for chain, (s, sp, d, dp) in (("INPUT", (dst, c.dport, src, c.sport)), ("OUTPUT", (src, c.sport, dst, c.dport))):
        cmd = [tool, "-w", "-t", "filter", "-D", chain, "--protocol", "tcp", "-m", "mark", "!", "--mark",
               "0xc114", "--source", s, "--sport", str(sp), "--destination", d, "--dport", str(dp), "-j", "DROP"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            warn(f"could not remove CRIU's iptables rule for {s}:{sp}: {e}")
            continue
        if r.returncode != 0:
            warn(f"could not remove CRIU's iptables rule for {s}:{sp}: {r.stderr.strip()}")
