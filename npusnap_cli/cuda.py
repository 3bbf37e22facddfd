"""The cuda backend: NVIDIA's by-pid checkpoint API (r555+), called through ctypes.

The driver does the work inside the target through its own threads; npusnap calls
cuCheckpointProcess{GetState,Lock,Checkpoint,Restore,Unlock}(pid, args) from outside, for every
process of the tree that holds a CUDA context. The cuda-checkpoint binary is never spawned.

Library: $NPUSNAP_LIBCUDA, default libcuda.so.1. The test shim (native/cudashim, test-only) is the
same API backed by npusim.

Which processes: a process is a candidate when its maps show /dev/nvidia* or libcuda (with the
test shim: the npusim runtime, the marker the shim reports), and a CUDA process when GetState
answers for it.

State names: the pipeline speaks RUNNING / LOCKED / BACKED_UP; CUDA's CHECKPOINTED is BACKED_UP.
FAILED is never passed on as a state: it raises DeviceFailed with what to do.

Manifest: DeviceState.gpus holds the UUIDs ("GPU-xxxxxxxx-...") of the checkpointed GPUs and
DeviceState.devices their driver ordinals. Which GPUs a process uses comes from NVML when it is
there (nvmlDeviceGetComputeRunningProcesses); otherwise every GPU the driver shows is recorded, so a
--device-map must then cover them all.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ._protocol import STATE_BACKED_UP, STATE_CHECKPOINTED, STATE_FAILED, STATE_LOCKED, STATE_RUNNING
from .backends import NoDevice
from .errors import (
    DeviceFailed,
    EnvironmentProblem,
    LockTimeout,
    NpusnapError,
    PermissionProblem,
    TargetNotFound,
    WrongState,
)
from .image import DeviceState, FileEntry
from .target import process_tree

DEFAULT_LIBRARY = "libcuda.so.1"
MIN_DRIVER = 12050        # r555: the checkpoint API
MIN_LOCK_TIMEOUT = 12080  # r570: CUcheckpointLockArgs.timeoutMs honoured

# CUprocessState
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: STATE_RUNNING, LOCKED: STATE_LOCKED, CHECKPOINTED: STATE_CHECKPOINTED, FAILED: STATE_FAILED,
               4: "CHECKPOINTING", 5: "RESTORING"}
PIPELINE_STATE = {RUNNING: STATE_RUNNING, LOCKED: STATE_LOCKED, CHECKPOINTED: STATE_BACKED_UP}

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


class CudaBackend(NoDevice):
    """Every CUDA process of a tree, driven through the by-pid API. The driver stages device memory
    in each process's own memory (CRIU dumps it), so backup writes no files of its own."""

    name = "cuda"

    def __init__(self, root: int, driver: Driver, pids: list[int],
                 device_map: Optional[dict[str, str]] = None) -> None:
        self.root = root
        self.driver = driver
        self.pids = pids
        self.device_map = device_map or {}
        self._gpus: Optional[list[str]] = None

    # -- construction
    @classmethod
    def for_checkpoint(cls, root: int, driver: Optional[Driver] = None) -> "CudaBackend":
        driver = driver or Driver.load()
        try:
            driver.init()
            if not driver.supports_checkpoint():
                raise EnvironmentProblem(
                    f"the NVIDIA driver ({driver.version_text()}) cannot checkpoint processes",
                    "checkpointing needs driver r555 or newer (r570+ for lock timeouts)")
        except CudaError as e:
            raise cuda_error(e, "initializing the CUDA driver") from e
        why: list[str] = []
        pids = find_cuda_pids(root, driver, why)
        if not pids:
            raise WrongState(f"no process in the tree of {root} holds a CUDA context"
                             + (f" ({'; '.join(why)})" if why else ""),
                             "use --device none to checkpoint without GPU state")
        backend = cls(root, driver, pids)
        backend._refuse_failed()
        return backend

    @classmethod
    def for_restore(cls, root: int, device: DeviceState, device_map: Optional[dict[str, str]] = None,
                    driver: Optional[Driver] = None) -> "CudaBackend":
        """After CRIU restore: the restored tree's processes the driver reports CHECKPOINTED."""
        driver = driver or Driver.load()
        try:
            driver.init()
        except CudaError as e:
            raise cuda_error(e, "initializing the CUDA driver") from e
        pids = []
        for p in process_tree(root):
            try:
                if driver.state(p.pid) in (CHECKPOINTED, FAILED):
                    pids.append(p.pid)
            except CudaError:
                continue
        if not pids:
            raise DeviceFailed(f"no restored process of {root} is in the CUDA CHECKPOINTED state",
                               "the checkpoint may not hold GPU state; see `npusnap inspect DIR`")
        backend = cls(root, driver, pids, device_map)
        backend._gpus = list(device.gpus)
        backend._refuse_failed()
        return backend

    # -- helpers
    def _states(self) -> dict[int, int]:
        out = {}
        for pid in self.pids:
            try:
                out[pid] = self.driver.state(pid)
            except CudaError as e:
                raise cuda_error(e, f"asking the CUDA state of process {pid}") from e
        return out

    def _refuse_failed(self) -> None:
        failed = [pid for pid, s in self._states().items() if s == FAILED]
        if failed:
            raise DeviceFailed(f"the CUDA driver reports process {failed[0]} as FAILED "
                               "(an earlier checkpoint or restore went wrong)", FAILED_HINT)

    def _each(self, what: str, fn: Any, pids: list[int], undo: Any = None) -> list[int]:
        """fn(pid) for each pid; on a failure undo(pid) the ones done (newest first) and raise."""
        done: list[int] = []
        for pid in pids:
            try:
                fn(pid)
            except CudaError as e:
                err = cuda_error(e, f"CUDA {what} of process {pid}", self.driver, pid)
                for d in reversed(done):
                    if undo is not None:
                        try:
                            undo(d)
                        except CudaError:
                            pass
                raise err from e
            done.append(pid)
        return done

    # -- the backend interface
    def state(self) -> str:
        states = self._states()
        if FAILED in states.values():
            self._refuse_failed()
        names = {PIPELINE_STATE.get(s, STATE_NAMES.get(s, str(s))) for s in states.values()}
        if len(names) == 1:
            return names.pop()
        return "MIXED(" + ", ".join(f"{p}:{STATE_NAMES.get(s, s)}" for p, s in sorted(states.items())) + ")"

    def describe(self) -> DeviceState:
        if self._gpus is None:
            try:
                visible = self.driver.gpus()
            except CudaError as e:
                raise cuda_error(e, "listing the GPUs") from e
            used = _nvml_gpus(self.pids)
            self._gpus = [g for g in visible if used is None or g in used]
            self._ordinals = [i for i, g in enumerate(visible) if g in self._gpus]
        return DeviceState(
            backend=self.name,
            devices=list(getattr(self, "_ordinals", [])),
            gpus=list(self._gpus),
            method="cuda-driver",  # the driver stages device memory in the process; CRIU dumps it
            runtime=f"{self.driver.path} ({self.driver.version_text()})",
        )

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        # The driver has no lease: a CLI that dies leaves the tree locked (`npusnap recover` undoes it).
        deadline = time.monotonic() + timeout

        def one(pid: int) -> None:
            left_ms = int(max(0.001, deadline - time.monotonic()) * 1000)
            self.driver.lock(pid, left_ms)

        self._each("lock", one, self.pids, self.driver.unlock)

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        self.describe()  # the GPUs are known only while the contexts exist
        self._each("checkpoint", self.driver.checkpoint, self.pids, lambda pid: self.driver.restore(pid))
        return []

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        pairs = self._pairs()
        self._each("restore", lambda pid: self.driver.restore(pid, pairs), self.pids)

    def unlock(self) -> None:
        self._each("unlock", self.driver.unlock, self.pids)

    def release(self) -> None:
        pass

    def back_to_running(self) -> None:
        """Rollback: each process back to RUNNING from wherever lock/checkpoint left it."""
        first: Optional[NpusnapError] = None
        for pid in self.pids:
            try:
                s = self.driver.state(pid)
                if s == CHECKPOINTED:
                    self.driver.restore(pid)
                    s = LOCKED
                if s == LOCKED:
                    self.driver.unlock(pid)
            except CudaError as e:
                first = first or cuda_error(e, f"CUDA rollback of process {pid}", self.driver, pid)
        if first is not None:
            raise first

    def _pairs(self) -> dict[str, str]:
        if not self.device_map:
            return {}
        validate_device_map(self._gpus or [], self.device_map)
        return dict(self.device_map)


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
