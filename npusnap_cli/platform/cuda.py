"""The CUDA driver: NVIDIA's by-pid checkpoint API (r555+), called through ctypes
(the cuda backend, backends/cuda.py, drives a process tree through it).

The driver does the work inside the target through its own threads; npusnap calls
cuCheckpointProcess{GetState,Lock,Checkpoint,Restore,Unlock}(pid, args) from outside, for every
process of the tree that holds a CUDA context. The cuda-checkpoint binary is never spawned.

Library: $NPUSNAP_LIBCUDA, default libcuda.so.1. The test shim (native/cudashim, test-only) is the
same API backed by npusim.

Which processes: a process is a candidate when its maps show /dev/nvidia* or libcuda (with the
test shim: the npusim runtime, the marker the shim reports), and a CUDA process when GetState
answers for it.

Manifest: DeviceState.gpus holds the UUIDs ("GPU-xxxxxxxx-...") of the checkpointed GPUs and
DeviceState.devices their driver ordinals. Which GPUs a process uses comes from NVML when it is
there (nvmlDeviceGetComputeRunningProcesses); otherwise every GPU the driver shows is recorded, so a
--device-map must then cover them all.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Optional

from .._protocol import STATE_CHECKPOINTED, STATE_FAILED, STATE_LOCKED, STATE_RUNNING
from ..errors import (
    DeviceFailed,
    EnvironmentProblem,
    LockTimeout,
    NpusnapError,
    PermissionProblem,
    TargetNotFound,
    WrongState,
)
from .procfs import process_tree

DEFAULT_LIBRARY = "libcuda.so.1"
MIN_DRIVER = 12050        # r555: the checkpoint API
MIN_LOCK_TIMEOUT = 12080  # r570: CUcheckpointLockArgs.timeoutMs honoured

# CUprocessState
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: STATE_RUNNING, LOCKED: STATE_LOCKED, CHECKPOINTED: STATE_CHECKPOINTED, FAILED: STATE_FAILED,
               4: "CHECKPOINTING", 5: "RESTORING"}

# CUresult values npusnap distinguishes
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_STUB_LIBRARY = 34
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_OPERATING_SYSTEM = 304
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_TIMEOUT = 909

FAILED_HINT = ("the driver cannot recover this process's GPU state in place: kill the process and "
               "restore it from its last checkpoint (the kernel log, `dmesg`, may say why)")


# The structures, as NVIDIA's cuda.h lays them out (all 64 bytes but the UUIDs).
class CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


class CUcheckpointGpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", CUuuid), ("newUuid", CUuuid)]


class CUcheckpointLockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class CUcheckpointCheckpointArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointUnlockArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointRestoreArgs(ctypes.Structure):
    _fields_ = [("gpuPairs", ctypes.POINTER(CUcheckpointGpuPair)), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
                ("reserved1", ctypes.c_uint64)]


assert ctypes.sizeof(CUcheckpointRestoreArgs) == 64 and ctypes.sizeof(CUcheckpointLockArgs) == 64


class DeviceMapError(NpusnapError):
    """A --device-map that cannot work: refused before anything starts (exit 2, a usage error)."""

    exit_code = 2


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {name} ({code})")
        self.call, self.code, self.name = call, code, name


def uuid_str(u: CUuuid) -> str:
    h = bytes(u.bytes).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def normalize_uuid(text: str) -> str:
    """'GPU-4e50...' or bare hex with or without dashes -> 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'."""
    h = text.strip().lower()
    if h.startswith("gpu-"):
        h = h[4:]
    h = h.replace("-", "")
    if len(h) != 32 or any(c not in "0123456789abcdef" for c in h):
        raise ValueError(f"{text!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid_struct(text: str) -> CUuuid:
    u = CUuuid()
    raw = bytes.fromhex(normalize_uuid(text)[4:].replace("-", ""))
    ctypes.memmove(u.bytes, raw, 16)
    return u


def library_path() -> str:
    return os.environ.get("NPUSNAP_LIBCUDA") or DEFAULT_LIBRARY


class Driver:
    """libcuda, loaded once per path; every call checked."""

    _cache: dict[str, "Driver"] = {}

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise EnvironmentProblem(f"cannot load the NVIDIA driver library {path}: {e}",
                                     "install the NVIDIA driver (r555+), or set NPUSNAP_LIBCUDA") from None
        self.shim_marker: Optional[str] = None
        if hasattr(self.lib, "npusnapCudaShimMarker"):  # the test shim (native/cudashim)
            f = self.lib.npusnapCudaShimMarker
            f.restype = ctypes.c_char_p
            self.shim_marker = f().decode()
        self._init_rc: Optional[int] = None

    @classmethod
    def load(cls, path: Optional[str] = None) -> "Driver":
        path = path or library_path()
        if path not in cls._cache:
            cls._cache[path] = cls(path)
        return cls._cache[path]

    # -- plumbing
    def _fn(self, name: str) -> Any:
        try:
            return getattr(self.lib, name)
        except AttributeError:
            raise EnvironmentProblem(
                f"the driver library {self.path} has no {name}: checkpointing needs driver r555 or newer "
                f"(this one reports {self.version_text()})", "upgrade the NVIDIA driver") from None

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        f = getattr(self.lib, "cuGetErrorName", None)
        if f is not None and f(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return f"CUresult {code}"

    def call(self, name: str, *args: Any) -> None:
        rc = int(self._fn(name)(*args))
        if rc != CUDA_SUCCESS:
            raise CudaError(name, rc, self.error_name(rc))

    def init(self) -> None:
        if self._init_rc is None:
            self._init_rc = int(self._fn("cuInit")(0))
        if self._init_rc != CUDA_SUCCESS:
            raise CudaError("cuInit", self._init_rc, self.error_name(self._init_rc))

    # -- queries
    def version(self) -> int:
        v = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return v.value

    def version_text(self) -> str:
        try:
            v = self.version()
        except (CudaError, NpusnapError):
            return "an unknown version"
        return f"CUDA {v // 1000}.{v % 1000 // 10} ({v})"

    def supports_checkpoint(self) -> bool:
        return hasattr(self.lib, "cuCheckpointProcessLock") and self.version() >= MIN_DRIVER

    def gpus(self) -> list[str]:
        """UUIDs of every GPU the driver shows, by ordinal."""
        self.init()
        n = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(n))
        out = []
        get_uuid = "cuDeviceGetUuid_v2" if hasattr(self.lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
        for i in range(n.value):
            dev, u = ctypes.c_int(), CUuuid()
            self.call("cuDeviceGet", ctypes.byref(dev), i)
            self.call(get_uuid, ctypes.byref(u), dev)
            out.append(uuid_str(u))
        return out

    # -- the checkpoint API
    def state(self, pid: int) -> int:
        self.init()
        s = ctypes.c_int(-1)
        self.call("cuCheckpointProcessGetState", int(pid), ctypes.byref(s))
        return s.value

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = CUcheckpointLockArgs(timeoutMs=max(1, int(timeout_ms)))
        self.call("cuCheckpointProcessLock", int(pid), ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self.call("cuCheckpointProcessCheckpoint", int(pid), ctypes.byref(CUcheckpointCheckpointArgs()))

    def restore(self, pid: int, pairs: Optional[dict[str, str]] = None) -> None:
        args = CUcheckpointRestoreArgs()
        if pairs:
            arr = (CUcheckpointGpuPair * len(pairs))()
            for i, (old, new) in enumerate(sorted(pairs.items())):
                arr[i].oldUuid, arr[i].newUuid = uuid_struct(old), uuid_struct(new)
            args.gpuPairs = ctypes.cast(arr, ctypes.POINTER(CUcheckpointGpuPair))
            args.gpuPairsCount = len(pairs)
        self.call("cuCheckpointProcessRestore", int(pid), ctypes.byref(args))

    def unlock(self, pid: int) -> None:
        self.call("cuCheckpointProcessUnlock", int(pid), ctypes.byref(CUcheckpointUnlockArgs()))

    # -- which processes
    def markers(self) -> tuple[str, ...]:
        base = ("/dev/nvidia", "libcuda.so")
        return base + ((self.shim_marker,) if self.shim_marker else ())


def maps_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def cuda_error(e: Exception, doing: str, driver: Optional[Driver] = None, pid: Optional[int] = None) -> NpusnapError:
    """The one place where driver results become npusnap's error kinds."""
    if isinstance(e, NpusnapError):
        return e
    message = f"{doing} failed: {e}"
    code = getattr(e, "code", None)
    if driver is not None and pid is not None:
        try:
            if driver.state(pid) == FAILED:
                return DeviceFailed(f"{message}; the driver now reports process {pid} as FAILED", FAILED_HINT)
        except (CudaError, NpusnapError):
            pass
    if code == CUDA_ERROR_TIMEOUT:
        return LockTimeout(message)
    if code == CUDA_ERROR_ILLEGAL_STATE:
        return WrongState(message)
    if code == CUDA_ERROR_NOT_PERMITTED or code == CUDA_ERROR_OPERATING_SYSTEM:
        return PermissionProblem(message)
    if code == CUDA_ERROR_NOT_FOUND:
        return TargetNotFound(message, "the process holds no CUDA context (or has exited)")
    if code in (CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_NO_DEVICE):
        return EnvironmentProblem(message, "checkpointing needs NVIDIA driver r555+ (r570+ for lock timeouts) "
                                           "and the GPUs the process used")
    return DeviceFailed(message)


def find_cuda_pids(root: int, driver: Driver, why: Optional[list[str]] = None) -> list[int]:
    """The processes of root's tree that hold a CUDA context: candidates by their maps, confirmed
    by GetState answering. `why` collects what ruled candidates out."""
    markers = driver.markers()
    out = []
    for p in process_tree(root):
        if not any(m in maps_of(p.pid) for m in markers):
            continue
        try:
            driver.state(p.pid)
        except CudaError as e:
            if why is not None:
                why.append(f"process {p.pid}: {e}")
            continue
        out.append(p.pid)
    return out


def _nvml_gpus(pids: list[int]) -> Optional[list[str]]:
    """UUIDs of the GPUs on which any of pids has a compute context, from NVML; None if NVML can't say."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
    except (OSError, AttributeError):
        return None

    class Proc(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3 layout)
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    try:
        get = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
            nvml.nvmlDeviceGetComputeRunningProcesses_v2
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        found, wanted = [], set(pids)
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                return None
            n = ctypes.c_uint(256)
            procs = (Proc * 256)()
            if get(handle, ctypes.byref(n), procs) != 0:
                return None
            if any(procs[j].pid in wanted for j in range(n.value)):
                buf = ctypes.create_string_buffer(96)
                if nvml.nvmlDeviceGetUUID(handle, buf, 96) != 0:
                    return None
                found.append(normalize_uuid(buf.value.decode()))
        return found or None
    except (AttributeError, ValueError):
        return None
    finally:
        nvml.nvmlShutdown()


def parse_device_map(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """['OLD=NEW', ...] -> {old_uuid: new_uuid}; DeviceMapError on bad syntax or duplicates."""
    out: dict[str, str] = {}
    for item in items:
        old, sep, new = item.partition("=")
        if not sep:
            raise DeviceMapError(f"--device-map {item!r}: expected OLD=NEW (two GPU UUIDs)")
        try:
            o, n = normalize_uuid(old), normalize_uuid(new)
        except ValueError as e:
            raise DeviceMapError(f"--device-map {item!r}: {e}") from None
        if o in out:
            raise DeviceMapError(f"--device-map names {o} twice")
        out[o] = n
    if len(set(out.values())) != len(out):
        raise DeviceMapError("--device-map sends two GPUs onto the same GPU")
    return out


def validate_device_map(checkpointed: list[str], device_map: dict[str, str],
                        driver: Optional[Driver] = None) -> None:
    """Refuse a map that does not cover every checkpointed GPU, names GPUs the checkpoint lacks,
    or (with a driver) targets GPUs this machine does not have."""
    if not device_map:
        return
    missing = [g for g in checkpointed if g not in device_map]
    if missing:
        raise DeviceMapError(f"--device-map does not cover checkpointed GPU {missing[0]}",
                           "map every GPU the checkpoint holds: " + ", ".join(checkpointed))
    extra = [g for g in device_map if g not in checkpointed]
    if extra:
        raise DeviceMapError(f"--device-map names GPU {extra[0]}, which is not in the checkpoint",
                           "the checkpoint holds: " + (", ".join(checkpointed) or "no GPUs"))
    if driver is not None:
        try:
            here = driver.gpus()
        except CudaError as e:
            raise cuda_error(e, "listing this machine's GPUs") from e
        absent = [n for n in device_map.values() if n not in here]
        if absent:
            raise DeviceMapError(f"--device-map targets GPU {absent[0]}, which this machine does not have",
                               "GPUs here: " + (", ".join(here) or "none"))


def probe() -> tuple[str, str, Optional[str], dict[str, Any]]:
    """(status, detail, fix, extra) for `npusnap check`'s cuda line."""
    path = library_path()
    try:
        driver = Driver.load(path)
    except EnvironmentProblem:
        return "info", f"no NVIDIA driver ({path}) found", None, {"library": path}
    extra: dict[str, Any] = {"library": path, "shim": driver.shim_marker is not None}
    try:
        version = driver.version()
    except (CudaError, EnvironmentProblem) as e:
        return "warn", f"{path}: cuDriverGetVersion failed: {e}", "check the NVIDIA driver installation", extra
    has_api = hasattr(driver.lib, "cuCheckpointProcessLock")
    extra.update(driver_version=version, checkpoint_api=has_api, supported=has_api and version >= MIN_DRIVER,
                 lock_timeouts=version >= MIN_LOCK_TIMEOUT)
    what = f"{path}: driver API {version // 1000}.{version % 1000 // 10} ({version})"
    if driver.shim_marker is not None:
        what += " [test shim]"
    if not extra["supported"]:
        return "warn", f"{what}; checkpointing not supported (needs r555+: CUDA 12.5)", \
            "upgrade the NVIDIA driver to r555 or newer (r570+ for lock timeouts)", extra
    note = "" if extra["lock_timeouts"] else "; lock timeouts need r570+ (CUDA 12.8)"
    return "ok", f"{what}; cuCheckpointProcess* available{note}", None, extra
