"""The CRIU options as flags (and so as config keys and NPUSNAP_* variables): one
decorator for checkpoint (and dump), one for restore. Each gathers its flags into a
`criu_opts` CriuOptions argument, so the commands stay thin."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional, TypeVar

import click

from ..criuopts import (
    CGROUP_MODES,
    NETWORK_LOCKS,
    CriuOptions,
    InheritFd,
    check_cgroup_root,
    check_external,
    check_join_ns,
    parse_ghost_limit,
)

F = TypeVar("F", bound=Callable[..., Any])


class SizeParam(click.ParamType):  # type: ignore[type-arg]
    name = "size"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        try:
            return parse_ghost_limit(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class InheritFdParam(click.ParamType):  # type: ignore[type-arg]
    name = "fd[N]:RES"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> InheritFd:
        if isinstance(value, InheritFd):
            return value
        try:
            return InheritFd.parse(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _external(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return check_external(tuple(value or ()))
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _external_option(what: str) -> Callable[[F], F]:
    return click.option("--external", "external", multiple=True, metavar="RES", callback=_external,
                        help=f"{what} CRIU resource RES as external (CRIU's --external: unix[INO], "
                             "tty[RDEV:DEV], file[MNT:INO], ...); repeatable.")


def _cgroup_root(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return check_cgroup_root(tuple(value or ()))
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _join_ns(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return check_join_ns(tuple(value or ()))
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _absolute(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    # CRIU runs in its own working directory: a relative path means ours.
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(os.path.abspath(v) for v in value)
    return os.path.abspath(value)


def _cgroup_options(side: str) -> list[Callable[[Any], Any]]:
    """--manage-cgroups [MODE], --cgroup-root, --cgroup-yard: the same flags on both sides."""
    reuse = " (default: what the checkpoint used)" if side == "restore" else ""
    return [
        click.option("--manage-cgroups", "manage_cgroups", type=click.Choice(list(CGROUP_MODES)), is_flag=False,
                     flag_value="soft", default=None, metavar="[MODE]",
                     help=f"How CRIU handles the tree's cgroups: {', '.join(CGROUP_MODES)} "
                          f"(the flag alone: soft){reuse}."),
        click.option("--cgroup-root", "cgroup_root", multiple=True, metavar="[CTRL:]PATH", callback=_cgroup_root,
                     help=f"The tree's root cgroup{' to restore into' if side == 'restore' else ''} "
                          "(for CTRL, or all controllers); repeatable."),
        click.option("--cgroup-yard", "cgroup_yard", type=click.Path(), default=None, callback=_absolute,
                     help="Where CRIU mounts the cgroup hierarchies (default: a temporary place it makes)."),
    ]


def _cgroups(kw: dict[str, Any]) -> dict[str, Any]:
    return {"manage_cgroups": kw.pop("manage_cgroups"), "cgroup_root": kw.pop("cgroup_root"),
            "cgroup_yard": kw.pop("cgroup_yard")}


def _gather(f: F, build: Callable[[dict[str, Any]], CriuOptions], options: list[Callable[[Any], Any]]) -> F:
    @functools.wraps(f)
    def wrapper(*args: Any, **kw: Any) -> Any:
        kw["criu_opts"] = build(kw)
        return f(*args, **kw)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


def dump_flags(f: F) -> F:
    """--link-remap --ghost-limit --ext-unix-sk --tcp-close --skip-in-flight --network-lock --external,
    the cgroup flags, --force-irmap --irmap-scan-path."""

    def build(kw: dict[str, Any]) -> CriuOptions:
        lock = kw.pop("network_lock")
        return CriuOptions(link_remap=kw.pop("link_remap"), ghost_limit=kw.pop("ghost_limit"),
                           ext_unix_sk=kw.pop("ext_unix_sk"), tcp_close=kw.pop("tcp_close"),
                           skip_in_flight=kw.pop("skip_in_flight"),
                           network_lock=None if lock == "auto" else lock, external=kw.pop("external"),
                           force_irmap=kw.pop("force_irmap"), irmap_scan_path=kw.pop("irmap_scan_path"),
                           **_cgroups(kw))

    return _gather(f, build, [
        click.option("--link-remap", is_flag=True,
                     help="Allow open files that were unlinked: CRIU links them back until restore."),
        click.option("--ghost-limit", type=SizeParam(), default=None, metavar="SIZE",
                     help="Largest deleted-but-open file CRIU copies into the checkpoint (default 1M; e.g. 8M)."),
        click.option("--ext-unix-sk", is_flag=True,
                     help="Allow Unix sockets connected to a peer outside the process tree (datagram)."),
        click.option("--tcp-close", is_flag=True,
                     help="Do not dump established TCP connections; restore them closed."),
        click.option("--skip-in-flight", is_flag=True,
                     help="Ignore TCP connections not yet accepted by a listening socket."),
        click.option("--network-lock", type=click.Choice(["auto", *NETWORK_LOCKS]), default="auto",
                     show_default=True,
                     help="How CRIU blocks dumped TCP connections (auto: what works here; see `npusnap check`)."),
        _external_option("Treat"),
        *_cgroup_options("checkpoint"),
        click.option("--force-irmap", is_flag=True,
                     help="Resolve every inotify/fanotify watch to a path at dump time (CRIU's --force-irmap)."),
        click.option("--irmap-scan-path", "irmap_scan_path", multiple=True, type=click.Path(), callback=_absolute,
                     help="Where CRIU looks for the files watches point to; repeatable."),
    ])


def restore_flags(f: F) -> F:
    """--tcp-close --external --inherit-fd --join-ns and the cgroup flags: restore-side additions to (or, for
    --manage-cgroups, choices over) what the dump recorded."""

    def build(kw: dict[str, Any]) -> CriuOptions:
        return CriuOptions(tcp_close=kw.pop("tcp_close"), external=kw.pop("external"),
                           inherit_fd=kw.pop("inherit_fd"), join_ns=kw.pop("join_ns"), **_cgroups(kw))

    return _gather(f, build, [
        click.option("--tcp-close", is_flag=True,
                     help="Restore established TCP connections closed (always so for a --tcp-close checkpoint)."),
        _external_option("Restore"),
        click.option("--inherit-fd", "inherit_fd", multiple=True, type=InheritFdParam(), metavar="fd[N]:RES",
                     help="Give the restored tree npusnap's open fd N in place of resource RES "
                          "(CRIU's --inherit-fd); repeatable."),
        *_cgroup_options("restore"),
        click.option("--join-ns", "join_ns", multiple=True, metavar="NS:FILE", callback=_join_ns,
                     help="Restore into the existing namespace FILE of kind NS (CRIU's --join-ns, "
                          "e.g. net:/var/run/netns/blue); repeatable."),
    ])
