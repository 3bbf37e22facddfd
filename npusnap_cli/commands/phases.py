"""One command per phase, for runbooks: status, lock, backup, dump, device-restore,
unlock, and recover (back to running from any intermediate state)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..criuopts import CriuOptions
from ..numbers import Seconds
from ..output import Terminal
from . import criu_option, json_option, pid_argument
from .criu_flags import dump_flags


def _step(term: Terminal, pid: str, step: str, message: str, lock_timeout: float = 60.0,
          rendezvous: Optional[Path] = None) -> None:
    from ..core.runbook import Step, run_step
    from ..platform.procfs import parse_pid

    done = run_step(parse_pid(pid), Step(step), lock_timeout, rendezvous)
    if term.json_mode:
        term.data(step, {"pid": done.pid, "state": done.state, "elapsed_ms": done.elapsed_ms})
    else:
        term.success(f"{message} ({done.elapsed_ms:.1f} ms); process {done.pid} is now {done.state}")


@click.command()
@pid_argument
@json_option
@click.pass_obj
def status(term: Terminal, pid: str) -> None:
    """Show which phase process PID is in, and its device state."""
    from ..core.runbook import status as read_status
    from ..platform.procfs import parse_pid

    doc = read_status(parse_pid(pid)).to_dict()
    if term.json_mode:
        term.data("status", doc)
        return
    from rich.markup import escape
    from rich.text import Text

    from ..output import shown

    agent = "agent loaded" if doc["agent"] else "no agent (npusnap run / attach to add it)"
    term.render(f"process {doc['pid']}: [bold]{escape(shown(doc['state']))}[/bold]"
                f"{' (stopped)' if doc['stopped'] else ''}; {agent}")
    if doc["runtime"]:
        term.render(Text(f"  runtime: {shown(doc['runtime'])}"))
    if doc["device"]:
        d = doc["device"]
        term.render(Text(shown(f"  device: {d.get('allocations', 0)} allocations, {d.get('bytes', 0)} bytes"
                                   f" on devices {d.get('devices', [])}")))


@click.command()
@pid_argument
@click.option("--timeout", type=Seconds(min=0.1), default=60.0, show_default=True, metavar="SECONDS",
              help="How long device work may take to quiesce.")
@json_option
@click.pass_obj
def lock(term: Terminal, pid: str, timeout: float) -> None:
    """LOCK: finish queued device work and block new device calls in PID."""
    _step(term, pid, "lock", "locked", timeout)


@click.command()
@pid_argument
@json_option
@click.pass_obj
def backup(term: Terminal, pid: str) -> None:
    """BACKUP: copy PID's device state into its host memory and release the device."""
    _step(term, pid, "backup", "device state backed up")


@click.command(name="device-restore")
@pid_argument
@click.option("--rendezvous", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              metavar="DIR", help="Where the HCCL ranks restored together meet to re-form their communicators: "
                                  "one private directory (shared storage across hosts), fresh for each restore, "
                                  "given to every rank's device-restore; they run at the same time.")
@json_option
@click.pass_obj
def device_restore(term: Terminal, pid: str, rendezvous: Optional[Path]) -> None:
    """DEVICE RESTORE: put PID's backed-up device state back on the device."""
    meet = rendezvous.absolute() if rendezvous else None
    _step(term, pid, "device-restore", "device state restored", rendezvous=meet)


@click.command()
@pid_argument
@json_option
@click.pass_obj
def unlock(term: Terminal, pid: str) -> None:
    """UNLOCK: let PID's device calls run again."""
    _step(term, pid, "unlock", "unlocked")


@click.command()
@pid_argument
@click.option("-D", "--directory", "directory", required=True, type=click.Path(path_type=Path),
              help="Where to write the checkpoint.")
@click.option("--leave-running", is_flag=True, help="Resume the process (still backed up) after the dump.")
@click.option("--shell-job", is_flag=True, help="The process shares a terminal with its shell.")
@click.option("--tcp-established", is_flag=True, help="Checkpoint established TCP connections.")
@click.option("--replace", is_flag=True, help="Atomically replace a checkpoint already in DIRECTORY.")
@dump_flags
@criu_option
@json_option
@click.pass_obj
def dump(term: Terminal, pid: str, directory: Path, leave_running: bool, shell_job: bool,
         tcp_established: bool, replace: bool, criu_path: Optional[str], criu_opts: CriuOptions) -> None:
    """DUMP: write PID (device already backed up) to DIRECTORY with CRIU."""
    from ..core.checkpoint import CheckpointOptions
    from ..core.checkpoint import dump as run_dump
    from ..platform.procfs import parse_pid

    opts = CheckpointOptions(directory=directory, leave_running=leave_running, shell_job=shell_job,
                             tcp_established=tcp_established, replace=replace, criu_path=criu_path,
                             criu=criu_opts)
    with term.reporter(live=not shell_job) as report:
        m = run_dump(parse_pid(pid), opts, progress=report)
    if term.json_mode:
        term.data("dump", {"directory": str(directory.absolute()), "pid": m.pid,
                           "bytes": sum(f.size for f in m.files), "left_running": leave_running,
                           "warnings": term.warnings})
    else:
        term.success(f"dumped {m.pid} into {directory}")


@click.command()
@pid_argument
@click.option("--device-images", type=click.Path(file_okay=False, path_type=Path),
              help="Where a direct backup wrote the device memory (DIR/device of the checkpoint); without it, the "
                   "memory a live checkpoint's daemon kept is taken back.")
@click.option("--parent-images", "parent_images", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="An incremental backup's parent's device images (PARENT/device), repeated up the chain, "
                   "parent first.")
@json_option
@click.pass_obj
def recover(term: Terminal, pid: str, device_images: Optional[Path], parent_images: tuple[Path, ...]) -> None:
    """Bring PID back to running from any intermediate phase (stopped, locked, backed up)."""
    from ..backends import State
    from ..core.recover import recover as run_recover
    from ..platform.procfs import parse_pid

    done = run_recover(parse_pid(pid), device_images, parent_images)
    if term.json_mode:
        term.data("recover", {"pid": done.pid, "was": done.was, "steps": done.steps, "state": State.RUNNING.value})
    else:
        term.success(f"process {done.pid} is running (was {done.was}; did: {', '.join(done.steps) or 'nothing'})")
