from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click

from ..backends import BACKENDS, DATA_PATHS
from ..criuopts import CriuOptions
from ..image.codecs import COMPRESS
from ..numbers import Seconds
from ..output import Terminal, human_bytes
from . import Command, criu_option, json_option
from .criu_flags import dump_flags

if TYPE_CHECKING:
    from ..image.format import Manifest


@click.command(cls=Command)
@click.argument("pids", metavar="PID...", nargs=-1, required=True)
@click.option("-D", "--directory", "directory", required=True, type=click.Path(path_type=Path),
              help="Where to write the checkpoint (created; must not hold one unless --replace).")
@click.option("--leave-running", is_flag=True, help="Keep the process running after the checkpoint.")
@click.option("--live", is_flag=True,
              help="With --leave-running (implied): stop the process only while its images are written to memory "
                   "(--live-staging), copy them to DIRECTORY while it runs on; an ordinary --leave-running "
                   "checkpoint, with a warning, when they would not fit there.")
@click.option("--live-staging", type=click.Path(path_type=Path), default=Path("/dev/shm"), show_default=True,
              metavar="DIR", help="The tmpfs directory a --live checkpoint's images are staged in.")
@click.option("--shell-job", is_flag=True, help="The process shares a terminal with its shell.")
@click.option("--tcp-established", is_flag=True, help="Checkpoint established TCP connections.")
@click.option("--device", type=click.Choice(BACKENDS), default="auto",
              show_default=True, help="Device backend (auto: found from the process).")
@click.option("--data-path", type=click.Choice(DATA_PATHS), default="auto", show_default=True,
              help="Device memory: straight from the device to DIR/device (direct, where the runtime allows), "
                   "or staged in the process and dumped by CRIU (in-process, the vendor way).")
@click.option("--lock-timeout", type=Seconds(min=0.1), default=60.0, show_default=True,
              metavar="SECONDS", help="How long device work may take to quiesce.")
@click.option("--lease", type=Seconds(min=1), default=10.0, show_default=True, metavar="SECONDS",
              help="If npusnap dies mid-checkpoint, the workload unlocks itself after running this long.")
@click.option("--criu-timeout", type=Seconds(min=1), default=None, metavar="SECONDS",
              help="Bound on CRIU's own dump (default: CRIU's).")
@click.option("--replace", is_flag=True, help="Atomically replace a checkpoint already in DIRECTORY.")
@click.option("--parent", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Incremental: write only the device memory changed since checkpoint DIR of the same process "
                   "(or set) and reference the rest (direct data path; restore needs DIR's whole chain; exit 8 if DIR "
                   "cannot be its parent).")
@click.option("--force", is_flag=True,
              help="Checkpoint HCCL ranks whose communicators have ranks outside the set (those ranks "
                   "will hang or fail; without --force this is refused, exit 11).")
@click.option("--dedup", is_flag=True,
              help="Keep host pages as chunks in a store beside DIRECTORY (PARENT/.npusnap-store), each chunk "
                   "stored once: what did not change since an earlier checkpoint there costs nothing again.")
@click.option("--compress", type=click.Choice(COMPRESS), default="none", show_default=True,
              help="Compress host pages, and direct device images, in the chunk store (zstd, lz4: imply "
                   "--dedup); auto compresses direct device images only, where it beats the disk (never slower "
                   "than none; none on a tmpfs).")
@dump_flags
@click.option("--sign-key", type=click.Path(path_type=Path), default=None, metavar="KEYFILE",
              help="Sign the manifest with this Ed25519 private key (PEM); restore/verify check it.")
@criu_option
@json_option
@click.pass_obj
def checkpoint(term: Terminal, pids: tuple[str, ...], directory: Path, leave_running: bool, live: bool,
               live_staging: Path, shell_job: bool,
               tcp_established: bool, device: str, data_path: str, lock_timeout: float, lease: float,
               criu_timeout: Optional[float],
               replace: bool, parent: Optional[Path], force: bool, dedup: bool, compress: str,
               sign_key: Optional[Path], criu_path: Optional[str], criu_opts: CriuOptions) -> None:
    """Checkpoint process PID into DIRECTORY: lock the device, back it up, dump with CRIU.

    By default the process is killed once the checkpoint is safely on disk (like
    `criu dump`); with --leave-running it carries on, and with --live it is stopped
    only while its state is copied to memory. A failure at any point leaves the
    process running and unlocked, and no checkpoint directory behind.

    Several PIDs make one set: every process (each with its tree) is locked at once,
    backed up and dumped into the one DIRECTORY, all or nothing (with --live every
    process runs on together once all are in memory); `npusnap restore` brings the
    whole set back.
    """
    from .. import warmup

    warmup.later(*term.closing_modules())  # the closing line: imported while CRIU dumps
    from ..backends import BackendName, DataPathChoice
    from ..core.checkpoint import CheckpointOptions
    from ..core.checkpoint import checkpoint as run_checkpoint
    from ..platform.procfs import parse_pid

    leave_running = leave_running or live
    opts = CheckpointOptions(directory=directory, leave_running=leave_running, shell_job=shell_job,
                             live=live, live_staging=live_staging,
                             tcp_established=tcp_established, device=BackendName(device),
                             data_path=DataPathChoice(data_path),
                             lock_timeout=lock_timeout,
                             lease=lease, criu_timeout=criu_timeout, replace=replace, criu_path=criu_path,
                             criu=criu_opts, force=force, dedup=dedup, compress=compress,
                             parent=parent)
    signer = None
    if sign_key:
        from ..image.signing import Signer

        signer = Signer(sign_key)  # a bad key fails before anything starts
    targets = [parse_pid(p) for p in pids]
    if live and compress != "none":
        raise click.UsageError("--live and --compress both stage the images in memory: give one of them")
    with term.reporter(live=not shell_job) as report:
        if len(targets) == 1:
            m = run_checkpoint(targets[0], opts, progress=report)
        else:
            from ..core.processset import checkpoint_set

            m = checkpoint_set(targets, opts, progress=report)
    if signer:
        signer.sign(directory.absolute())
    size = sum(f.size for f in m.files)
    pages = m.options.get("host_pages")
    if pages:  # what reached the disk: the page images only as far as they were new to the store
        size += pages["new_bytes"] - pages["raw_bytes"]
    if m.is_set:
        _report_set(term, m, directory, leave_running, size)
        return
    if term.json_mode:
        term.data("checkpoint", {"directory": str(directory.absolute()), "pid": m.pid,
                                 "left_running": leave_running, "bytes": size,
                                 "device": m.device.__dict__, "phases": [p.__dict__ for p in m.phases],
                                 "parent": None if parent is None else str(parent.absolute()),
                                 "downtime_s": (m.options.get("live") or {}).get("downtime_s"),
                                 "warnings": term.warnings})
        return
    phases = ", ".join(f"{p.name} {p.seconds:.2f}s" for p in m.phases)
    term.success(f"checkpointed {m.pid} into {directory} ({human_bytes(size)}; {phases})")
    if m.options.get("live"):
        term.info(f"live: process {m.pid} was stopped for {m.options['live']['downtime_s']:.2f}s")
    if m.parent is not None:
        term.info(f"incremental: {human_bytes(m.device.referenced)} of device memory referenced in {parent}")
    if not leave_running:
        term.info(f"process {m.pid} was stopped; `npusnap restore {directory}` brings it back")


def _report_set(term: Terminal, m: Manifest, directory: Path, leave_running: bool, size: int) -> None:
    from ..image.format import member_summary

    members = [member_summary(m, e) for e in m.members]
    if term.json_mode:
        term.data("checkpoint", {"directory": str(directory.absolute()), "pid": m.pid,
                                 "pids": [e.pid for e in m.members], "left_running": leave_running,
                                 "bytes": size, "device": m.device.__dict__,
                                 "phases": [p.__dict__ for p in m.phases], "members": members,
                                 "downtime_s": (m.options.get("live") or {}).get("downtime_s"),
                                 "warnings": term.warnings})
        return
    phases = ", ".join(f"{p.name} {p.seconds:.2f}s" for p in m.phases)
    listed = " ".join(str(e.pid) for e in m.members)
    term.success(f"checkpointed the set {listed} into {directory} ({human_bytes(size)}; {phases})")
    for s in members:
        term.info(f"  process {s['pid']}: {human_bytes(s['bytes'])} in {s['files']} files, "
                  f"device {s['device']['backend']} {human_bytes(s['device']['bytes'])}")
    if m.options.get("live"):
        term.info(f"live: the set was stopped for {m.options['live']['downtime_s']:.2f}s "
                  "(until its last process ran on)")
    if not leave_running:
        term.info(f"the processes were stopped; `npusnap restore {directory}` brings them all back")
