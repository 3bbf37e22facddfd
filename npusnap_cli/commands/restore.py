from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import click

from ..criuopts import CriuOptions
from ..output import Terminal

if TYPE_CHECKING:
    from ..core.lazy import LazyRestore
    from ..core.restore import RestoreOptions
from . import Command, criu_option, json_option, trust_options
from .criu_flags import restore_flags


@click.command(cls=Command)
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("-d", "--detach", is_flag=True, help="Return once the process runs instead of waiting for it.")
@click.option("--pidfile", type=click.Path(path_type=Path), help="Write the restored pid here.")
@click.option("--no-verify", is_flag=True, help="Skip the checksum pass (faster; trusts the files).")
@click.option("--lazy", is_flag=True,
              help="Run the process before its memory is back: host pages on first touch (CRIU lazy-pages), "
                   "device memory on first touch and in the background (npusim, direct data path), all of it "
                   "checked. Returns (--detach) or waits for the process once all memory is in.")
@click.option("--criu-only", is_flag=True,
              help="Runbook: stop after CRIU RESTORE (run device-restore and unlock next).")
@click.option("--rendezvous", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              metavar="DIR", help="HCCL ranks restored by separate restores (other hosts) meet here to re-form "
                                  "their communicators: one private directory, fresh for this restore, given "
                                  "to every rank's restore (default: a private one of this restore's own).")
@click.option("--device-socket", "device_socket", metavar="PATH", default=None,
              help="npusim: the device daemon the restored processes reconnect to (a restore on another host: "
                   "that host's daemon), whatever NPUSIM_SOCKET they started with (default: the one each used).")
@click.option("--device-map", "device_map", multiple=True, metavar="OLD=NEW",
              help="cuda: restore GPU OLD (UUID) onto GPU NEW; repeat to cover every checkpointed GPU.")
@restore_flags
@trust_options
@criu_option
@json_option
@click.pass_context
def restore(ctx: click.Context, directory: Path, detach: bool, pidfile: Optional[Path], no_verify: bool,
            lazy: bool, criu_only: bool, rendezvous: Optional[Path], device_socket: Optional[str],
            device_map: tuple[str, ...],
            criu_path: Optional[str],
            criu_opts: CriuOptions,
            require_signature: bool, trusted_keys: tuple[Path, ...]) -> None:
    """Restore the process checkpointed in DIRECTORY.

    Verifies the checkpoint first and refuses a bad one. In the foreground it waits
    for the restored process and exits with its exit code; --detach returns at once.

    A set (`npusnap checkpoint PID PID ...`) comes back whole or not at all: in the
    foreground npusnap waits for every member and exits with the first non-zero exit
    code in member order; --pidfile gets one pid a line.

    --lazy: the process (a set: every member) runs as soon as CRIU has restored it, and
    its memory comes in behind it. The command stays until all of it is in (--pidfile is
    written at once; an interrupt is ignored meanwhile: the memory must not be cut off); a
    failed page server kills the process; a device chunk that fails its checksum fails the
    process's access to it (ACL_ERROR_RT_DEVICE_MEM_ERROR), is reported, and makes the
    command exit 8 (in the foreground, after the process exits).
    """
    from .. import warmup
    from ..core.restore import RestoreOptions, wait_exit_code
    from ..core.restore import restore as run_restore

    term: Terminal = ctx.obj
    warmup.later(*term.closing_modules())  # the closing line's rich: imported while CRIU restores
    mapping = _device_map(directory, device_map) if device_map else None  # checked before anything starts
    opts = RestoreOptions(directory, criu_path, verify=not no_verify, criu_only=criu_only, device_map=mapping,
                          criu=criu_opts, require_signature=require_signature, trusted_keys=list(trusted_keys),
                          rendezvous=rendezvous.absolute() if rendezvous else None,
                          daemon_socket=os.path.abspath(device_socket) if device_socket else None, lazy=lazy)
    is_set, shell_job = _peek(directory)
    if is_set:
        _restore_set(ctx, term, opts, detach, pidfile, shell_job)
        return
    with term.reporter(live=not shell_job) as report:
        result = run_restore(opts, progress=report)
    if pidfile:
        _write_pidfile(pidfile, result.pid)
    phases = [p.__dict__ for p in result.phases]
    doc: dict[str, object] = {"directory": str(directory), "pid": result.pid, "phases": phases}
    failure = None
    if result.lazy is not None:
        failure = _finish_lazy(term, result.pid, result.lazy, doc)
    if detach:
        if term.json_mode:
            term.data("restore", {**doc, "warnings": term.warnings})
        elif failure is None:
            term.success(f"restored process {result.pid} from {directory}")
        if failure is not None:
            raise failure
        return
    term.info(f"restored process {result.pid}; waiting for it to exit")
    code = wait_exit_code(result.pid)
    if term.json_mode:
        term.data("restore", {**doc, "exit_code": code, "warnings": term.warnings})
    if failure is not None:
        raise failure
    ctx.exit(code)


def _finish_lazy(term: Terminal, pid: int, lazy: "LazyRestore", doc: dict[str, Any]) -> "Optional[Exception]":
    """Waits until all memory of a lazy restore is in; the failure to report once the rest is done."""
    from ..errors import ImageInvalid

    term.info(f"process {pid} runs; its memory comes in lazily")
    out = lazy.finish()
    doc["lazy"] = {"seconds": round(out.seconds, 3), "pages_status": out.pages_status, "device": out.device,
                   "workload_exited": out.workload_exited, "problems": out.problems}
    if out.failed:
        for p in out.problems:
            term.warn(p)
        return ImageInvalid(out.problems[0], "the checkpoint is damaged: restore another one (npusnap verify DIR)")
    if out.workload_exited:
        term.info(f"process {pid} exited before all its memory was in")
    else:
        term.info(f"all memory of process {pid} is in ({out.seconds:.2f} s after the restore)")
    return None


def _restore_set(ctx: click.Context, term: Terminal, opts: "RestoreOptions", detach: bool,
                 pidfile: Optional[Path], shell_job: bool) -> None:
    from ..core.processset import restore_set
    from ..core.restore import wait_exit_code
    from ..errors import NpusnapError

    with term.reporter(live=not shell_job) as report:
        result = restore_set(opts, progress=report)
    pids = [m.pid for m in result.members]
    if pidfile:
        _write_pidfile(pidfile, *pids)
    members = [{"checkpointed_pid": m.checkpointed, "pid": m.pid, "phases": [p.__dict__ for p in m.phases]}
               for m in result.members]
    doc = {"directory": str(opts.directory), "pid": pids[0], "pids": pids, "members": members,
           "phases": [p.__dict__ for p in result.phases]}
    failure: Optional[Exception] = None
    for member, m, lazy in zip(members, result.members, result.lazy):  # --lazy: every member's memory in
        try:
            problem = _finish_lazy(term, m.pid, lazy, member)
            failure = failure or problem
        except NpusnapError as e:  # that member was killed: the others' memory still comes in
            if failure is not None:  # the first is the command's error line
                term.warn(e.message)
            failure = failure or e
    if detach:
        if term.json_mode:
            term.data("restore", {**doc, "warnings": term.warnings})
        elif failure is None:
            term.success(f"restored the set {' '.join(map(str, pids))} from {opts.directory}")
        if failure is not None:
            raise failure
        return
    term.info(f"restored the set {' '.join(map(str, pids))}; waiting for every member to exit")
    codes = [wait_exit_code(pid) for pid in pids]
    for member, code in zip(members, codes):
        member["exit_code"] = code
    code = next((c for c in codes if c != 0), 0)
    if term.json_mode:
        term.data("restore", {**doc, "exit_code": code, "warnings": term.warnings})
    if failure is not None:
        raise failure
    ctx.exit(code)


def _peek(directory: Path) -> tuple[bool, bool]:
    """Whether the checkpoint is a process set's, and a shell job's (restored onto our terminal,
    where a live progress display would draw over it). Errors are left to the restore to report."""
    from ..errors import NpusnapError
    from ..image.format import load_manifest

    try:
        m = load_manifest(directory.absolute())
    except NpusnapError:
        return False, False
    return m.is_set, bool(m.options.get("shell_job"))


def _write_pidfile(pidfile: Path, *pids: int) -> None:
    """A random temporary name made with O_EXCL|O_NOFOLLOW, then renamed: a link planted
    in a shared directory is never written through."""
    from ..errors import StorageProblem

    for _ in range(8):  # os.urandom is what secrets.token_hex reads, without hmac's import
        tmp = pidfile.with_name(f".{pidfile.name}.{os.urandom(8).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        except OSError as e:
            raise StorageProblem(f"cannot write the pidfile {pidfile}: {e.strerror}") from e
        try:
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"{pid}\n" for pid in pids))
            os.replace(tmp, pidfile)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StorageProblem(f"cannot write the pidfile {pidfile}: {e.strerror}") from e
        return
    raise StorageProblem(f"cannot pick a temporary name for the pidfile {pidfile}")


def _device_map(directory: Path, items: tuple[str, ...]) -> dict[str, str]:
    """Parse --device-map and check it against the checkpoint and this machine, before anything starts."""
    from ..backends import BackendName
    from ..image.format import load_manifest
    from ..platform import cuda

    mapping = cuda.parse_device_map(items)
    device = load_manifest(directory.absolute()).device
    if device.backend != BackendName.CUDA:
        raise cuda.DeviceMapError(f"--device-map applies to cuda checkpoints; {directory} holds "
                                  f"{device.backend} device state")
    cuda.validate_device_map(list(device.gpus), mapping, cuda.Driver.load())
    return mapping
