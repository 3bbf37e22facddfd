"""Recover: bring a process back to running from any state a checkpoint or a restore
can leave it in, with nobody else's help. The state machine behind `npusnap recover`
and the guardian.

    stopped (a dump left the tree stopped)     -> SIGCONT the root and its descendants
    BACKED_UP in-process                       -> device restore, unlock
    BACKED_UP external (direct path)           -> restore external + import from --device-images, unlock
                                                  (without: the memory a live checkpoint's daemon kept, taken back)
    LOCKED awaiting an import (a failed import) -> import from --device-images, unlock
    LOCKED                                     -> unlock
    RUNNING, or no agent                       -> nothing
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ..backends import BackendName, State
from ..backends.agent import AgentBackend
from ..backends.base import unlock_unless_running
from ..backends.direct import DirectBackend
from ..errors import NpusnapError, WrongState
from ..platform import simimages
from ..platform.agent import AgentClient, AgentNotFound, AgentProblem, agent_error
from ..platform.procfs import open_target
from .processes import resume_tree


@dataclass
class Recovered:
    pid: int
    was: str
    steps: list[str] = field(default_factory=list)


def recover(pid: int, device_images: Optional[Path] = None, chain: Sequence[Path] = ()) -> Recovered:
    """chain: an incremental backup's parent images (device directories, parent first)."""
    target = open_target(pid)
    done = Recovered(target.pid, State.RUNNING.value)
    if resume_tree(target.pid):
        done.steps.append("resume")
    try:
        reply = AgentClient(target.pid).status()
    except AgentNotFound:
        return done
    except AgentProblem as e:
        raise agent_error(e, f"asking the agent of process {target.pid}") from e
    state = State.parse(reply.state)
    done.was = state.value
    if state == State.RUNNING:
        return done
    external = (reply.device or {}).get("data_path") == "external"
    direct = simimages.offers_direct(reply.device)  # an import may be awaited (after `restore external`)
    hint = f"its device data is in files: npusnap recover {target.pid} --device-images DIR/device"
    backend = (DirectBackend(target.pid, BackendName.SIM) if external
               else AgentBackend(target.pid, BackendName.SIM if direct else BackendName.AUTO))
    if isinstance(backend, DirectBackend):
        backend.use_chain(chain)
    if state == State.BACKED_UP and external and device_images is None:
        # A live checkpoint's (its CLI died): the daemon may have kept the device memory, which the
        # external restore takes back in place; when it did not, the unlock below is refused.
        try:
            backend.client.restore(external=True)
        except AgentProblem as e:
            raise agent_error(e, f"device restore (external) of process {target.pid}") from e
        simimages.drop_snapshot(target.pid)  # that checkpoint is over: the daemon's copies go
        done.steps.append("device-take-back")
    elif state == State.BACKED_UP:
        backend.restore(device_images)
        done.steps.append("device-restore")
    try:
        unlock_unless_running(backend)  # its lease may run out meanwhile: the agent unlocks it itself
    except NpusnapError as e:
        # LOCKED after `restore external` whose import failed: the daemon refuses Unlock until it is in.
        if "device-take-back" in done.steps:
            raise WrongState(f"process {target.pid} was backed up by the direct path and its daemon kept "
                             "no memory of it", hint) from e
        if not direct or state != State.LOCKED:
            raise
        if device_images is None:
            raise type(e)(e.message, hint) from e
        simimages.import_device(target.pid, device_images, None, chain=chain)
        done.steps.append("device-import")
        unlock_unless_running(backend)
    done.steps.append("unlock")
    return done
