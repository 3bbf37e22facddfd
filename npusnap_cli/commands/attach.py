from __future__ import annotations

import click

from ..output import Terminal
from . import json_option, pid_argument


@click.command()
@pid_argument
@json_option
@click.pass_obj
def attach(term: Terminal, pid: str) -> None:
    """Inject the npusnap agent into running process PID (ptrace + dlopen).

    The process is stopped only for the injection and never left stopped.
    Attaching twice is harmless.
    """
    from ..agent import AgentClient, has_agent, inject
    from ..errors import DeviceFailed
    from ..target import open_target, parse_pid

    target = open_target(parse_pid(pid))
    already = has_agent(target.pid)
    if not already:
        try:
            inject(target.pid)
        except Exception as e:
            from ..errors import NpusnapError

            if isinstance(e, NpusnapError):
                raise
            raise DeviceFailed(f"could not inject the agent into {target.pid}: {e}",
                               getattr(e, "hint", None)) from e
    reply = AgentClient(target.pid).status()
    if term.json_mode:
        term.data("attach", {"pid": target.pid, "injected": not already, "state": reply.state,
                             "runtime": reply.runtime})
    else:
        term.success(f"agent {'already present' if already else 'injected'} in {target.pid}"
                     f" (device runtime: {reply.runtime or 'none loaded yet'})")
