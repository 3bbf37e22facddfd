"""Device backends: one interface over the ways device state gets in and out of a process.

* none    no device state; CRIU alone.
* sim     npusim, driven in-process through the injected agent (CANN's snapshot API).
* ascend  a real CANN runtime, driven exactly like sim (the agent calls the same API).
* cuda    NVIDIA's by-pid cuCheckpointProcess* driver API (cuda.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from .errors import (
    DeviceFailed,
    LeaseLost,
    LockTimeout,
    NpusnapError,
    PermissionProblem,
    TargetNotFound,
    WrongState,
)
from .image import DeviceState, FileEntry

BACKENDS = ("auto", "none", "sim", "ascend", "cuda")


class NoDevice:
    """A process without device state: every device phase is a no-op."""

    name = "none"
    method = "none"

    def state(self) -> str:
        return "RUNNING"

    def describe(self) -> DeviceState:
        return DeviceState()

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        pass

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        """Take the device state off the device; returns the image files it wrote
        itself into device_dir (checksummed and fsync'd), if any."""
        return []

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        """Put the device state back (from device_dir's files, for backends that write them)."""

    def unlock(self) -> None:
        pass

    def release(self) -> None:
        """Stop holding the device lock's lease (the checkpoint is over, one way or another)."""

    def back_to_running(self) -> None:
        """Rollback: undo whatever part of lock and backup happened."""

    def adopt_lease(self, lease: float) -> None:
        """Restore: take over the lease the restored process's lock still holds, if any."""

    def fence(self) -> None:
        """Before each step: renew the lock's lease now and make sure it is still ours.
        Raises LeaseLost when it ran out (we were stopped or frozen past it)."""


class LeaseKeeper:
    """Renews the agent's lease while we work, so the workload unlocks itself if we die.

    Renewals fail while CRIU has the process frozen; that is fine: the agent
    counts only time the process actually ran."""

    def __init__(self, pid: int, lease: float) -> None:
        import threading

        from .agent import AgentClient

        self.client = AgentClient(pid, connect_timeout=0.5)
        self.lease = lease
        self.lost = False  # the agent said the lease ran out: the next fence() stops the pipeline
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"lease-{pid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from .agent import E_LEASE_LOST, AgentError, AgentProblem

        while not self.stopped.wait(self.lease / 4):
            try:
                self.client.renew(self.lease)
            except AgentError as e:
                if e.code == E_LEASE_LOST:
                    self.lost = True
                    return
            except AgentProblem:
                pass

    def renew_now(self) -> bool:
        """Renew at once; False when the agent says the lease ran out."""
        from .agent import E_LEASE_LOST, AgentError

        if self.lost:
            return False
        try:
            self.client.renew(self.lease)
        except AgentError as e:
            if e.code != E_LEASE_LOST:
                raise
            self.lost = True
        return not self.lost

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


class AgentBackend(NoDevice):
    """CANN-style in-process snapshot, commanded through the agent's socket."""

    method = "in-process"

    def __init__(self, pid: int, name: str) -> None:
        from .agent import AgentClient

        self.pid = pid
        self.name = name
        self.client = AgentClient(pid)
        self._last: Optional[Any] = None
        self._keeper: Optional[LeaseKeeper] = None

    def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        from .agent import AgentProblem

        try:
            reply = getattr(self.client, what)(*args, **kwargs)
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
            method=self.method,
            runtime=reply.runtime,
            endpoint=_sim_endpoint(self.pid) if self.name == "sim" else None,
            resources={str(k): int(v) for k, v in (dev.get("resources") or {}).items()},
        )

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        self._call("lock", *((timeout, lease) if lease else (timeout,)))
        if lease:
            self._keeper = LeaseKeeper(self.pid, lease)

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        self._call("backup")
        return []

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        self._call("restore")

    def unlock(self) -> None:
        self.release()
        self._call("unlock")

    def back_to_running(self) -> None:
        state = self.state()
        if state == "BACKED_UP":
            self.restore()
        if state in ("LOCKED", "BACKED_UP"):
            self.unlock()
        self.release()

    def adopt_lease(self, lease: float) -> None:
        """Restore: the restored agent still holds the dump's lease; keep it renewed while we
        finish (none armed, or already run out: the agent's state then says what is left)."""
        from .agent import AgentProblem

        try:
            self.client.renew(lease)
        except AgentProblem:
            return
        self._keeper = LeaseKeeper(self.pid, lease)

    def fence(self) -> None:
        from .agent import AgentProblem

        if self._keeper is None:
            return
        try:
            ours = self._keeper.renew_now()
        except AgentProblem as e:
            raise agent_error(e, f"renewing the lease on process {self.pid}'s device lock") from e
        if not ours:
            raise LeaseLost(f"the lease on process {self.pid}'s device lock ran out while npusnap was not "
                            "running; the agent took the workload back, so npusnap stops here")

    def release(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None


class DirectBackend(AgentBackend):
    """npusim's direct path: the daemon streams device memory straight into DIR/device/
    (zero chunks elided, checksummed while streaming) and the process keeps only metadata,
    so device memory is neither staged in host RAM nor written twice. A real CANN runtime
    offers only the in-process path."""

    method = "direct"

    def __init__(self, pid: int, name: str) -> None:
        super().__init__(pid, name)
        self._images: Optional[tuple[Path, list[FileEntry]]] = None

    def describe(self) -> DeviceState:
        state = super().describe()
        state.method = self.method
        return state

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        from . import devicefiles

        if device_dir is None:
            raise WrongState("the direct data path writes device images: it needs a directory")
        exported = devicefiles.export_device(self.pid, device_dir)
        self._images = (device_dir, exported.files)
        self._call("backup", external=True)
        return exported.files

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        from . import devicefiles

        if device_dir is None and self._images is not None:
            device_dir, files = self._images
        if device_dir is None:
            raise WrongState(f"no device images to restore process {self.pid} from",
                             f"name them: npusnap recover {self.pid} --device-images DIR/device")
        # Without a file list (recover), every image in the directory is read; each chunk is still checked.
        devicefiles.restore_direct(self.client, self.pid, device_dir, list(files) if files else None)

    def back_to_running(self) -> None:
        from . import devicefiles

        state = self.state()
        if state == "BACKED_UP":
            self.restore()
        if state in ("LOCKED", "BACKED_UP"):
            try:
                self.unlock()
            except NpusnapError:
                # LOCKED after a failed import: the daemon refuses Unlock until the data is in.
                if state != "LOCKED" or self._images is None:
                    raise
                devicefiles.import_device(self.pid, self._images[0], self._images[1])
                self.unlock()
        self.release()


def _sim_endpoint(pid: int) -> str:
    from .devicefiles import daemon_socket

    return daemon_socket(pid)


def agent_error(e: Exception, doing: str) -> NpusnapError:
    """The one place where the agent client's errors become npusnap's error kinds."""
    from . import agent

    message = f"{doing} failed: {e}"
    hint = getattr(e, "hint", None)
    if isinstance(e, agent.AgentNotFound):
        return WrongState(message, hint)
    if isinstance(e, agent.AgentImpostor):
        return PermissionProblem(message, hint)
    if isinstance(e, agent.InjectFailed):
        kind = {agent.INJECT_NO_PROCESS: TargetNotFound,
                agent.INJECT_PERMISSION: PermissionProblem}.get(e.exit_status, DeviceFailed)
        return kind(message, hint)
    if isinstance(e, agent.AgentError):
        kind = {agent.LOCK_TIMEOUT: LockTimeout, agent.E_STATE: WrongState, agent.E_NO_RUNTIME: WrongState,
                agent.E_DENIED: PermissionProblem}.get(e.code, DeviceFailed)
        return kind(message, hint)
    return DeviceFailed(message, hint)


def select(pid: int, requested: str = "auto", maps: str = "", data_path: str = "auto") -> NoDevice:
    """The backend for a process: as requested, or found from the process itself.
    data_path: auto (direct when the runtime offers it) | direct | in-process."""
    if requested == "none":
        return NoDevice()
    if requested == "cuda" or (requested == "auto" and "/dev/nvidia" in maps):
        from .cuda import CudaBackend

        return CudaBackend.for_checkpoint(pid)
    from .agent import AgentClient, AgentNotFound, AgentProblem

    try:
        reply = AgentClient(pid).status()
    except AgentNotFound:
        if requested == "auto" and _shim_cuda(pid, maps):
            from .cuda import CudaBackend

            return CudaBackend.for_checkpoint(pid)
        if requested in ("sim", "ascend") or "libascendcl" in maps:
            raise WrongState(
                f"process {pid} holds device state but has no npusnap agent",
                f"start it with `npusnap run -- CMD`, or inject the agent with `npusnap attach {pid}`",
            ) from None
        return NoDevice()
    except AgentProblem as e:
        raise agent_error(e, f"asking the agent of process {pid}") from e
    if reply.runtime is None:
        if requested in ("sim", "ascend") or "libascendcl" in maps:
            raise WrongState(f"process {pid} has the agent but it finds no device runtime in the process",
                             "use --device none, or check that the workload uses the device")
        return NoDevice()
    name = requested if requested != "auto" else ("sim" if reply.device is not None else "ascend")
    from .devicefiles import offers_direct

    direct = offers_direct(reply.device)
    if data_path == "direct" and not direct:
        raise WrongState(f"process {pid}'s device runtime offers only the in-process path",
                         "use --data-path auto or in-process")
    if direct and data_path != "in-process":
        return DirectBackend(pid, name)
    return AgentBackend(pid, name)


def _shim_cuda(pid: int, maps: str) -> bool:
    """--device auto under the CUDA test shim (NPUSNAP_LIBCUDA set to it): a process without the
    agent that maps the runtime the shim names and answers GetState is a CUDA process. A real
    driver is never asked here: real CUDA processes are found by their /dev/nvidia* mappings."""
    import os

    if not os.environ.get("NPUSNAP_LIBCUDA"):
        return False
    from .cuda import CudaError, Driver

    try:
        driver = Driver.load()
        if driver.shim_marker is None or driver.shim_marker not in maps:
            return False
        driver.state(pid)
    except (CudaError, NpusnapError):
        return False
    return True


def for_restore(pid: int, device: DeviceState, device_map: Optional[dict[str, str]] = None) -> NoDevice:
    """The backend that finishes a restore of a checkpoint whose device section is `device`."""
    if device.backend == "cuda":
        from .cuda import CudaBackend

        return CudaBackend.for_restore(pid, device, device_map)
    if device_map:
        raise WrongState(f"--device-map applies to cuda checkpoints; this one is {device.backend}")
    if device.method == DirectBackend.method:
        return DirectBackend(pid, device.backend)
    return AgentBackend(pid, device.backend)
