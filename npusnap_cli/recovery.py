"""Recover: bring a process back to running from any state a checkpoint or a restore
can leave it in, with nobody else's help. The state machine behind `npusnap recover`
and the guardian.

    stopped (a dump left the tree stopped)     -> SIGCONT the root and its descendants
    BACKED_UP in-process                       -> device restore, unlock
    BACKED_UP external (direct path)           -> restore external + import from --device-images, unlock
    LOCKED awaiting an import (a failed import) -> import from --device-images, unlock
    LOCKED                                     -> unlock
    RUNNING, or no agent                       -> nothing
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ._protocol import STATE_BACKED_UP, STATE_LOCKED, STATE_RUNNING
from .errors import NpusnapError, WrongState
from .target import open_target, proc_stat, process_tree


@dataclass
class Recovered:
    pid: int
    was: str
    steps: list[str] = field(default_factory=list)


def resume_tree(root: int) -> list[int]:
    """SIGCONT root and every descendant that is stopped; returns those resumed."""
    resumed = []
    for p in process_tree(root):
        fields = proc_stat(p.pid)
        if fields and fields[1] in ("T", "t"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                resumed.append(p.pid)
    return resumed


def recover(pid: int, device_images: Optional[Path] = None) -> Recovered:
    from . import devicefiles
    from .agent import AgentClient, AgentNotFound, AgentProblem
    from .backends import AgentBackend, DirectBackend, agent_error

    target = open_target(pid)
    done = Recovered(target.pid, STATE_RUNNING)
    if resume_tree(target.pid):
        done.steps.append("resume")
    try:
        reply = AgentClient(target.pid).status()
    except AgentNotFound:
        return done
    except AgentProblem as e:
        raise agent_error(e, f"asking the agent of process {target.pid}") from e
    done.was = state = str(reply.state)
    if state == STATE_RUNNING:
        return done
    external = (reply.device or {}).get("data_path") == "external"
    direct = devicefiles.offers_direct(reply.device)  # an import may be awaited (after `restore external`)
    hint = f"its device data is in files: npusnap recover {target.pid} --device-images DIR/device"
    backend = DirectBackend(target.pid, "sim") if external else AgentBackend(target.pid, "sim" if direct else "auto")
    if state == STATE_BACKED_UP:
        if external and device_images is None:
            raise WrongState(f"process {target.pid} was backed up by the direct path", hint)
        backend.restore(device_images)
        done.steps.append("device-restore")
    try:
        backend.unlock()
    except NpusnapError as e:
        # LOCKED after `restore external` whose import failed: the daemon refuses Unlock until it is in.
        if not direct or state != STATE_LOCKED:
            raise
        if device_images is None:
            raise type(e)(e.message, hint) from e
        devicefiles.import_device(target.pid, device_images, None)
        done.steps.append("device-import")
        backend.unlock()
    done.steps.append("unlock")
    return done
