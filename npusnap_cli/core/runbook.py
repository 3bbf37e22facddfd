"""The runbook's one-phase-at-a-time commands (status, lock, backup, device-restore, unlock), as a
library: each acts on the process's agent and says where the process is afterwards."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..backends import BackendName, DataPathChoice, State, select
from ..backends.agent import AgentBackend
from ..errors import WrongState
from ..platform.agent import AgentClient, AgentNotFound, AgentProblem, agent_error
from ..platform.procfs import open_target, proc_stat
from . import communicators


class Step(str, enum.Enum):
    LOCK = "lock"
    BACKUP = "backup"
    DEVICE_RESTORE = "device-restore"
    UNLOCK = "unlock"


@dataclass
class StepDone:
    pid: int
    state: Optional[str]  # the agent's state after the step
    elapsed_ms: float


@dataclass
class Status:
    pid: int
    agent: bool
    state: Optional[str]
    runtime: Optional[str]
    device: Optional[dict[str, Any]]
    stopped: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def agent_backend(pid: int) -> AgentBackend:
    """The backend of a process with an agent and device state; refused otherwise."""
    target = open_target(pid)
    # The runbook stages device memory in the process; `dump` then writes it with the rest.
    backend = select(target.pid, BackendName.AUTO, target.maps(), data_path=DataPathChoice.IN_PROCESS)
    if not isinstance(backend, AgentBackend):
        raise WrongState(f"process {target.pid} has no device state to lock or back up",
                         f"checkpoint it directly: `npusnap checkpoint {target.pid} -D DIR`")
    return backend


def run_step(pid: int, step: Step, lock_timeout: float = 60.0, rendezvous: Optional[Path] = None) -> StepDone:
    """rendezvous: where the HCCL ranks of a restored set meet (device-restore; communicators.py)."""
    backend = agent_backend(pid)
    if step == Step.LOCK:
        backend.lock(lock_timeout)
    elif step == Step.BACKUP:
        backend.backup()
    elif step == Step.DEVICE_RESTORE:
        communicators.hand(backend, rendezvous)
        backend.restore()
    else:
        backend.unlock()
    reply = backend.last_reply
    assert reply is not None  # every step asked the agent
    return StepDone(backend.pid, reply.state, reply.elapsed_ms)


def status(pid: int) -> Status:
    target = open_target(pid)
    try:
        reply = AgentClient(target.pid).status()
        found = Status(target.pid, True, reply.state, reply.runtime, reply.device, False)
    except AgentNotFound:
        found = Status(target.pid, False, State.RUNNING.value, None, None, False)
    except AgentProblem as e:  # a squatter, or an agent that does not answer: one line, not exit 3
        raise agent_error(e, f"asking the agent of process {target.pid}") from e
    fields = proc_stat(target.pid)
    found.stopped = bool(fields) and fields[1] in ("T", "t")
    return found
