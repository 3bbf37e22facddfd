"""One command per phase, for runbooks: status, lock, backup, dump, device-restore,
unlock, and recover (back to running from any intermediate state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from .._protocol import STATE_RUNNING
from ..criuopts import CriuOptions
from ..numbers import Seconds
from ..output import Terminal
from . import criu_option, json_option, pid_argument
from .criu_flags import dump_flags


def _agent(pid: str) -> Any:
    from ..backends import AgentBackend, select
    from ..errors import WrongState
    from ..target import open_target, parse_pid

    target = open_target(parse_pid(pid))
    # The runbook stages device memory in the process; `dump` then writes it with the rest.
    backend = select(target.pid, "auto", target.maps(), data_path="in-process")
    if not isinstance(backend, AgentBackend):
        raise WrongState(f"process {target.pid} has no device state to lock or back up",
                         f"checkpoint it directly: `npusnap checkpoint {target.pid} -D DIR`")
    return backend


def _done(term: Terminal, kind: str, backend: Any, message: str) -> None:
    reply = backend._last
    if term.json_mode:
        term.data(kind, {"pid": backend.pid, "state": reply.state, "elapsed_ms": reply.elapsed_ms})
    else:
        term.success(f"{message} ({reply.elapsed_ms:.1f} ms); process {backend.pid} is now {reply.state}")


@click.command()
@pid_argument
@json_option
@click.pass_obj
def status(term: Terminal, pid: str) -> None:
    """Show which phase process PID is in, and its device state."""
    from ..agent import AgentClient, AgentNotFound, AgentProblem
    from ..backends import agent_error
    from ..target import open_target, parse_pid

    target = open_target(parse_pid(pid))
    try:
        reply = AgentClient(target.pid).status()
        doc: dict[str, Any] = {"pid": target.pid, "agent": True, "state": reply.state,
                               "runtime": reply.runtime, "device": reply.device}
    except AgentNotFound:
        doc = {"pid": target.pid, "agent": False, "state": STATE_RUNNING, "runtime": None, "device": None}
    except AgentProblem as e:  # a squatter, or an agent that does not answer: one line, not exit 3
        raise agent_error(e, f"asking the agent of process {target.pid}") from e
    stat = Path(f"/proc/{target.pid}/stat").read_text().rpartition(")")[2].split()[0]
    doc["stopped"] = stat in ("T", "t")
    if term.json_mode:
        term.data("status", doc)
        return
    from rich.markup import escape
    from rich.text import Text

    from ..output import shown

    agent = "agent loaded" if doc["agent"] else "no agent (npusnap run / attach to add it)"
    term.render(f"process {target.pid}: [bold]{escape(shown(doc['state']))}[/bold]"
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
    backend = _agent(pid)
    backend.lock(timeout)
    _done(term, "lock", backend, "locked")


@click.command()
@pid_argument
@json_option
@click.pass_obj
def backup(term: Terminal, pid: str) -> None:
    """BACKUP: copy PID's device state into its host memory and release the device."""
    backend = _agent(pid)
    backend.backup()
    _done(term, "backup", backend, "device state backed up")


@click.command(name="device-restore")
@pid_argument
@json_option
@click.pass_obj
def device_restore(term: Terminal, pid: str) -> None:
    """DEVICE RESTORE: put PID's backed-up device state back on the device."""
    backend = _agent(pid)
    backend.restore()
    _done(term, "device-restore", backend, "device state restored")


@click.command()
@pid_argument
@json_option
@click.pass_obj
def unlock(term: Terminal, pid: str) -> None:
    """UNLOCK: let PID's device calls run again."""
    backend = _agent(pid)
    backend.unlock()
    _done(term, "unlock", backend, "unlocked")


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
    from ..pipeline import CheckpointOptions, checkpoint
    from ..target import parse_pid

    opts = CheckpointOptions(directory=directory, leave_running=leave_running, shell_job=shell_job,
                             tcp_established=tcp_established, replace=replace, criu_path=criu_path,
                             criu=criu_opts)
    with term.reporter(live=not shell_job) as report:
        m = checkpoint(parse_pid(pid), opts, report=report, device_phases=False)
    if term.json_mode:
        term.data("dump", {"directory": str(directory.absolute()), "pid": m.pid,
                           "bytes": sum(f.size for f in m.files), "left_running": leave_running})
    else:
        term.success(f"dumped {m.pid} into {directory}")


@click.command()
@pid_argument
@click.option("--device-images", type=click.Path(file_okay=False, path_type=Path),
              help="Where a direct backup wrote the device memory (DIR/device of the checkpoint).")
@json_option
@click.pass_obj
def recover(term: Terminal, pid: str, device_images: Optional[Path]) -> None:
    """Bring PID back to running from any intermediate phase (stopped, locked, backed up)."""
    from ..recovery import recover as run_recover
    from ..target import parse_pid

    done = run_recover(parse_pid(pid), device_images)
    if term.json_mode:
        term.data("recover", {"pid": done.pid, "was": done.was, "steps": done.steps, "state": STATE_RUNNING})
    else:
        term.success(f"process {done.pid} is running (was {done.was}; did: {', '.join(done.steps) or 'nothing'})")
