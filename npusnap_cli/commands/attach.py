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
    from ..platform.agent import AgentClient, AgentProblem, agent_error, has_agent, inject
    from ..platform.procfs import open_target, parse_pid

    target = open_target(parse_pid(pid))
    already = has_agent(target.pid)
    try:
        if not already:
            inject(target.pid)
        reply = AgentClient(target.pid).status()
    except AgentProblem as e:
        raise agent_error(e, f"injecting the agent into {target.pid}") from e
    if term.json_mode:
        term.data("attach", {"pid": target.pid, "injected": not already, "state": reply.state,
                             "runtime": reply.runtime})
    else:
        term.success(f"agent {'already present' if already else 'injected'} in {target.pid}"
                     f" (device runtime: {reply.runtime or 'none loaded yet'})")
