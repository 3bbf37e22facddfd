from __future__ import annotations

import shlex
from typing import Optional

import click

from ..numbers import Count, Size
from ..output import Terminal, human_bytes
from . import json_option

socket_option = click.option("--socket", "sock", metavar="PATH", envvar="NPUSIM_SOCKET",
                             help="The daemon's socket (default $NPUSIM_SOCKET, else /run/npusim/daemon.sock for root, "
                                  "$XDG_RUNTIME_DIR/npusim/daemon.sock for a user).")


@click.group()
def device() -> None:
    """Manage npusim, the software NPU daemon (for machines without an accelerator)."""


@device.command()
@socket_option
@click.option("--devices", type=Count(1, 64), default=2, show_default=True, help="Number of devices.")
@click.option("--memory", type=Size(), default="4G", show_default=True, help="Memory per device (e.g. 4G, 512M).")
@click.option("--group", metavar="NAME", default=None,
              help="Also serve the members of this group (like CANN's HwHiAiUser); default: only you and root.")
@click.option("--hccl-listen", metavar="ADDR[:PORT]", default=None,
              help="Where the daemon takes other daemons' HCCL traffic (IPv4; default 127.0.0.1, any free port): "
                   "the node's address when ranks span hosts.")
@json_option
@click.pass_obj
def start(term: Terminal, sock: Optional[str], devices: int, memory: str, group: Optional[str],
          hccl_listen: Optional[str]) -> None:
    """Start the daemon (does nothing if one already runs on the socket)."""
    from ..platform import simdaemon

    try:
        size = simdaemon.parse_size(memory)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--memory") from None
    path = simdaemon.socket_path(sock)
    if group is not None:
        import grp

        try:
            grp.getgrnam(group)
        except KeyError:
            raise click.BadParameter(f"no such group: {group}", param_hint="--group") from None
    if hccl_listen is not None:
        try:
            simdaemon.check_hccl_listen(hccl_listen)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--hccl-listen") from None
    pid, started = simdaemon.start(path, devices, size, group=group, hccl_listen=hccl_listen)
    if term.json_mode:
        term.data("device-start", {"socket": path, "pid": pid, "started": started})
    elif started:
        term.success(f"npusim daemon {pid} on {path}: {devices} devices x {human_bytes(size)}")
    else:
        term.info(f"npusim daemon {pid} already running on {path}")


@device.command()
@socket_option
@json_option
@click.pass_obj
def stop(term: Terminal, sock: Optional[str]) -> None:
    """Stop the daemon."""
    from ..platform import simdaemon

    path = simdaemon.socket_path(sock)
    pid = simdaemon.stop(path)
    if term.json_mode:
        term.data("device-stop", {"socket": path, "pid": pid, "stopped": pid is not None})
    else:
        term.info(f"stopped npusim daemon {pid}" if pid else f"no npusim daemon on {path}")


@device.command()
@socket_option
@json_option
@click.pass_obj
def status(term: Terminal, sock: Optional[str]) -> None:
    """Show devices, memory used/free, and client processes."""
    from ..errors import DeviceFailed
    from ..platform import simdaemon

    path = simdaemon.socket_path(sock)
    st = simdaemon.status(path)
    if st is None:
        raise DeviceFailed(f"no npusim daemon answers on {path}", "start one with `npusnap device start`")
    if term.json_mode:
        term.data("device-status", {"socket": path, **st})
        return
    from rich.table import Table

    term.render(f"npusim daemon {st.get('pid')} on {path}")
    table = Table("device", "total", "used", "free", box=None, header_style="bold")
    for d in st.get("devices", []):
        table.add_row(str(d.get("id")), human_bytes(d.get("total", 0)), human_bytes(d.get("used", 0)),
                      human_bytes(d.get("free", 0)))
    term.render(table)
    clients = st.get("clients", [])
    if clients:
        ct = Table("client pid", "device memory", box=None, header_style="bold")
        for c in clients:
            ct.add_row(str(c.get("pid")), human_bytes(c.get("bytes", 0)))
        term.render(ct)
    else:
        term.render("no client processes")


@device.command()
@socket_option
def env(sock: Optional[str]) -> None:
    """Print shell exports for the simulated CANN toolkit: eval "$(npusnap device env)"."""
    from ..platform import simdaemon

    for key, value in simdaemon.shell_env(simdaemon.socket_path(sock)).items():
        click.echo(f"export {key}={shlex.quote(value)}")
