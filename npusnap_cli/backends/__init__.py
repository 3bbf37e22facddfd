"""Device backends: one interface (base.Backend) over the ways device state gets in and out of a
process, one module per implementation, and the choice between them (here).

* none         no device state; CRIU alone                                  (none.py)
* in-process   sim and ascend: CANN's snapshot API, called by the agent     (agent.py)
* direct       sim: npusim's daemon streams device memory to DIR/device/     (direct.py)
* cuda         NVIDIA's by-pid cuCheckpointProcess* driver API              (cuda.py)
"""

from __future__ import annotations

from typing import Optional

from ..errors import ImageInvalid, WrongState
from ..image.format import DeviceState
from .base import Backend, BackendName, DataPath, DataPathChoice, State, unlock_unless_running

# The implementations (and the platform adapters they load) are imported where a backend is
# chosen, so that the CLI's option definitions can read the names above without them.

BACKENDS = tuple(b.value for b in BackendName)  # --device choices
DATA_PATHS = tuple(d.value for d in DataPathChoice)  # --data-path choices

__all__ = ["BACKENDS", "DATA_PATHS", "Backend", "BackendName", "DataPath", "DataPathChoice", "State",
           "for_restore", "select", "unlock_unless_running"]


def select(pid: int, requested: BackendName = BackendName.AUTO, maps: str = "",
           data_path: DataPathChoice = DataPathChoice.AUTO) -> Backend:
    """The backend for a process: as requested, or found from the process itself.
    data_path: auto (direct when the runtime offers it) | direct | in-process."""
    # Each implementation is imported on the branch that picks it: a checkpoint of a CPU-only
    # process loads no device backend's modules (the CUDA driver's ctypes bindings among them).
    from .none import NoDevice

    requested, data_path = BackendName(requested), DataPathChoice(data_path)
    if requested == BackendName.NONE:
        return NoDevice()
    if requested == BackendName.CUDA or (requested == BackendName.AUTO and "/dev/nvidia" in maps):
        from .cuda import CudaBackend

        return CudaBackend.for_checkpoint(pid)
    from ..platform.agent import AgentClient, AgentNotFound, AgentProblem, agent_error
    from ..testhooks import shim_cuda_process

    wants_npu = requested in (BackendName.SIM, BackendName.ASCEND) or "libascendcl" in maps
    try:
        reply = AgentClient(pid).status()
    except AgentNotFound:
        if requested == BackendName.AUTO and shim_cuda_process(pid, maps):
            from .cuda import CudaBackend

            return CudaBackend.for_checkpoint(pid)
        if wants_npu:
            raise WrongState(
                f"process {pid} holds device state but has no npusnap agent",
                f"start it with `npusnap run -- CMD`, or inject the agent with `npusnap attach {pid}`",
            ) from None
        return NoDevice()
    except AgentProblem as e:
        raise agent_error(e, f"asking the agent of process {pid}") from e
    if reply.runtime is None:
        if wants_npu:
            raise WrongState(f"process {pid} has the agent but it finds no device runtime in the process",
                             "use --device none, or check that the workload uses the device")
        return NoDevice()
    from ..platform.simimages import offers_direct
    from .agent import AgentBackend
    from .direct import DirectBackend

    if requested == BackendName.AUTO:
        requested = BackendName.SIM if reply.device is not None else BackendName.ASCEND
    direct = offers_direct(reply.device)
    if data_path == DataPathChoice.DIRECT and not direct:
        raise WrongState(f"process {pid}'s device runtime offers only the in-process path",
                         "use --data-path auto or in-process")
    if direct and data_path != DataPathChoice.IN_PROCESS:
        return DirectBackend(pid, requested)
    return AgentBackend(pid, requested)


def for_restore(pid: int, device: DeviceState, device_map: Optional[dict[str, str]] = None) -> Backend:
    """The backend that finishes a restore of a checkpoint whose device section is `device`."""
    from .agent import AgentBackend
    from .cuda import CudaBackend
    from .direct import DirectBackend

    if device.backend == BackendName.CUDA:
        return CudaBackend.for_restore(pid, device, device_map)
    if device_map:
        raise WrongState(f"--device-map applies to cuda checkpoints; this one is {device.backend}")
    try:
        name = BackendName(device.backend)
    except ValueError:
        raise ImageInvalid(f"the checkpoint names an unknown device backend {device.backend!r}") from None
    if device.method == DataPath.DIRECT:
        return DirectBackend(pid, name)
    return AgentBackend(pid, name)
