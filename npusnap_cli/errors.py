"""One error tree; each kind carries its exit code and a hint that says how to fix it.

Exit codes (documented in the README for scheduler scripts):
  0 success   1 the restored workload's own non-zero exit (foreground restore)
  2 usage     3 internal error          4 no such process   5 permission denied
  6 environment cannot checkpoint (CRIU, kernel, privileges)
  7 CRIU failed                         8 checkpoint image invalid or corrupt
  9 device / agent failure             10 lock timeout
 11 wrong phase order / state          12 storage problem (space, read-only, exists,
                                           -D is not a directory npusnap wrote)
    (11 also: an HCCL communicator of a member has ranks outside the checkpointed set)
 13 the target cannot be checkpointed (pid 1, a kernel thread)
 14 configuration file problem (unknown key, bad value, not YAML)
 15 a job checkpoint or restore was aborted (a worker failed, timed out or was lost;
    every rank was undone and runs on, no job checkpoint was committed)
130 interrupted (Ctrl-C; everything was rolled back)
"""

from __future__ import annotations

from typing import Optional


class NpusnapError(Exception):
    """Base of every error npusnap reports to the user."""

    exit_code = 3
    default_hint: Optional[str] = None

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def one_line(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class TargetNotFound(NpusnapError):
    exit_code = 4
    default_hint = "check the pid with `ps -p PID`"


class PermissionProblem(NpusnapError):
    exit_code = 5
    default_hint = "run as root or as the process's owner (CAP_SYS_PTRACE and CAP_CHECKPOINT_RESTORE)"


class EnvironmentProblem(NpusnapError):
    exit_code = 6
    default_hint = "run `npusnap check` to see what is missing"


class CriuFailed(NpusnapError):
    exit_code = 7


class ImageInvalid(NpusnapError):
    exit_code = 8


class DeviceFailed(NpusnapError):
    exit_code = 9


class LockTimeout(DeviceFailed):
    exit_code = 10
    default_hint = "device work did not finish in time; retry with a longer --lock-timeout"


class LeaseLost(DeviceFailed):
    default_hint = ("npusnap was stopped (Ctrl-Z, SIGSTOP, a frozen cgroup) longer than --lease; "
                    "checkpoint again, or raise --lease")


class WrongState(NpusnapError):
    exit_code = 11
    default_hint = "run `npusnap status PID` to see which phase the process is in"


class PeersOutsideSet(WrongState):
    """A member holds an HCCL communicator whose other ranks are not being checkpointed with it."""

    default_hint = ("checkpoint every rank of the communicator in one `npusnap checkpoint PID PID ...`, "
                    "or pass --force (the ranks left out then hang or fail in their next collective)")


class JobBusy(WrongState):
    """Another job checkpoint of the same job is under way."""

    default_hint = "wait for it to end; `npusnap job status DIR` tells whether it committed"


class StorageProblem(NpusnapError):
    exit_code = 12


class UnsupportedTarget(NpusnapError):
    exit_code = 13


class ConfigProblem(NpusnapError):
    exit_code = 14
    default_hint = "fix or remove the key; `npusnap config show` lists every key and its value"


class JobAborted(NpusnapError):
    exit_code = 15
    default_hint = "every rank runs on and no job checkpoint was committed; see the workers' lines above"


class Interrupted(NpusnapError):
    exit_code = 130

    def __init__(self, message: str = "interrupted; everything done so far was rolled back") -> None:
        super().__init__(message)


EXIT_CODES = {
    0: "success",
    1: "the restored workload exited non-zero (foreground restore passes its exit code through)",
    2: "usage error (bad option or argument)",
    3: "internal error (a bug: rerun with -v and report it)",
    TargetNotFound.exit_code: "no such process",
    PermissionProblem.exit_code: "permission denied",
    EnvironmentProblem.exit_code: "this machine cannot checkpoint (CRIU, kernel, privileges)",
    CriuFailed.exit_code: "CRIU failed (see DIR/logs/)",
    ImageInvalid.exit_code: "checkpoint directory invalid or corrupt",
    DeviceFailed.exit_code: "device runtime or agent failure",
    LockTimeout.exit_code: "device lock timed out",
    WrongState.exit_code: "wrong phase order or process state; or an HCCL communicator with ranks outside the set; "
                            "or another job checkpoint of the same job runs",
    StorageProblem.exit_code: "storage problem (no space, read-only, already exists, -D not written by npusnap)",
    UnsupportedTarget.exit_code: "the target cannot be checkpointed (pid 1, a kernel thread)",
    ConfigProblem.exit_code: "configuration file problem (unknown key, bad value, not YAML)",
    JobAborted.exit_code: "a job checkpoint or restore was aborted (every rank undone, nothing committed)",
    Interrupted.exit_code: "interrupted; rolled back",
}
