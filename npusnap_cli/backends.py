"""Device backends: one interface over the ways device state gets in and out of a process.

* none    no device state; CRIU alone.
* sim     npusim, driven in-process through the injected agent (CANN's snapshot API).
* ascend  a real CANN runtime, driven exactly like sim (the agent calls the same API).
* cuda    NVIDIA's by-pid cuCheckpointProcess* driver API (not built yet).
"""

from __future__ import annotations

from typing import Any, Optional

from .errors import (DeviceFailed, EnvironmentProblem, LockTimeout, NpusnapError, PermissionProblem,
                     TargetNotFound, WrongState)
from .image import DeviceState

BACKENDS = ("auto", "none", "sim", "ascend", "cuda")


class NoDevice:
    """A process without device state: every device phase is a no-op."""

    name = "none"

    def state(self) -> str:
        return "RUNNING"

    def describe(self) -> DeviceState:
        return DeviceState()

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        pass

    def backup(self) -> None:
        pass

    def restore(self) -> None:
        pass

    def unlock(self) -> None:
        pass

    def release(self) -> None:
        """Stop holding the device lock's lease (the checkpoint is over, one way or another)."""


class LeaseKeeper:
    """Renews the agent's lease while we work, so the workload unlocks itself if we die.

    Renewals fail while CRIU has the process frozen; that is fine: the agent
    counts only time the process actually ran."""

    def __init__(self, pid: int, lease: float) -> None:
        import threading

        from .agent import AgentClient

        self.client = AgentClient(pid, connect_timeout=0.5)
        self.lease = lease
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"lease-{pid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from .agent import AgentProblem

        while not self.stopped.wait(self.lease / 4):
            try:
                self.client.renew(self.lease)
            except AgentProblem:
                pass

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


class AgentBackend(NoDevice):
    """CANN-style in-process snapshot, commanded through the agent's socket."""

    def __init__(self, pid: int, name: str) -> None:
        from .agent import AgentClient

        self.pid = pid
        self.name = name
        self.client = AgentClient(pid)
        self._last: Optional[Any] = None
        self._keeper: Optional[LeaseKeeper] = None

    def _call(self, what: str, *args: Any) -> Any:
        from .agent import AgentProblem

        try:
            reply = getattr(self.client, what)(*args)
        except AgentProblem as e:
            raise agent_error(e, f"device {what} of process {self.pid}") from e
        self._last = reply
        return reply

    def state(self) -> str:
        return str(self._call("status").state)

    def describe(self) -> DeviceState:
        reply = self._last if self._last is not None and self._last.device else self._call("status")
        dev = reply.device or {}
        return DeviceState(
            backend=self.name,
            devices=list(dev.get("devices", [])),
            allocations=int(dev.get("allocations", 0)),
            bytes=int(dev.get("bytes", 0)),
            method="in-process",
            runtime=reply.runtime,
        )

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        self._call("lock", *((timeout, lease) if lease else (timeout,)))
        if lease:
            self._keeper = LeaseKeeper(self.pid, lease)

    def backup(self) -> None:
        self._call("backup")

    def restore(self) -> None:
        self._call("restore")

    def unlock(self) -> None:
        self.release()
        self._call("unlock")

    def release(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None


def agent_error(e: Exception, doing: str) -> NpusnapError:
    """The one place where the agent client's errors become npusnap's error kinds."""
    from . import agent

    message = f"{doing} failed: {e}"
    hint = getattr(e, "hint", None)
    if isinstance(e, agent.AgentNotFound):
        return WrongState(message, hint)
    if isinstance(e, agent.InjectFailed):
        kind = {agent.INJECT_NO_PROCESS: TargetNotFound,
                agent.INJECT_PERMISSION: PermissionProblem}.get(e.exit_status, DeviceFailed)
        return kind(message, hint)
    if isinstance(e, agent.AgentError):
        kind = {agent.LOCK_TIMEOUT: LockTimeout, agent.E_STATE: WrongState, agent.E_NO_RUNTIME: WrongState,
                agent.E_DENIED: PermissionProblem}.get(e.code, DeviceFailed)
        return kind(message, hint)
    return DeviceFailed(message, hint)


def select(pid: int, requested: str = "auto", maps: str = "") -> NoDevice:
    """The backend for a process: as requested, or found from the process itself."""
    if requested == "none":
        return NoDevice()
    if requested == "cuda" or (requested == "auto" and "/dev/nvidia" in maps):
        raise EnvironmentProblem("the cuda backend is not available in this build",
                                 "use --device none to checkpoint without GPU state")
    from .agent import AgentClient, AgentNotFound, AgentProblem

    try:
        reply = AgentClient(pid).status()
    except AgentNotFound:
        if requested in ("sim", "ascend") or "libascendcl" in maps:
            raise WrongState(
                f"process {pid} holds device state but has no npusnap agent",
                f"start it with `npusnap run -- CMD`, or inject the agent with `npusnap attach {pid}`",
            ) from None
        return NoDevice()
    except AgentProblem as e:
        raise agent_error(e, f"asking the agent of process {pid}") from e
    if reply.runtime is None:
        if requested in ("sim", "ascend"):
            raise WrongState(f"process {pid} has the agent but no device runtime loaded",
                             "use --device none, or check that the workload uses the device")
        return NoDevice()
    name = requested if requested != "auto" else ("sim" if reply.device is not None else "ascend")
    return AgentBackend(pid, name)
