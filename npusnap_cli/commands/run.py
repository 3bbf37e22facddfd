from __future__ import annotations

import os
from typing import Optional

import click

from ..output import Terminal


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--agent-log", type=click.Path(dir_okay=False), help="Append the agent's command log here.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def run(term: Terminal, agent_log: Optional[str], command: tuple[str, ...]) -> None:
    """Run COMMAND with the npusnap agent preloaded, so it can be checkpointed.

    npusnap execs COMMAND: its pid, stdio, exit code and signals are the
    workload's own (`npusnap run -- train.py & pid=$!` gives the workload's pid).
    """
    from .. import native
    from ..errors import EnvironmentProblem, TargetNotFound

    if not native.AGENT_LIB.exists():
        raise EnvironmentProblem(f"agent library missing at {native.AGENT_LIB}", "reinstall npusnap (pip install .)")
    env = dict(os.environ)
    preload = [p for p in env.get("LD_PRELOAD", "").split() if p and p != str(native.AGENT_LIB)]
    env["LD_PRELOAD"] = " ".join([str(native.AGENT_LIB), *preload])
    if agent_log:
        env["NPUSNAP_AGENT_LOG"] = os.path.abspath(agent_log)
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        raise TargetNotFound(f"command not found: {command[0]}", "check the command and PATH") from None
    except PermissionError:
        raise TargetNotFound(f"command not executable: {command[0]}", "check its permissions") from None
