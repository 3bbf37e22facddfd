"""`npusnap job ...`: checkpoint and restore a whole multi-node Slurm job (core/job/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import click

from ..image.codecs import COMPRESS
from ..numbers import Seconds
from ..output import Terminal, human_bytes
from . import json_option

F = TypeVar("F", bound=Callable[..., Any])
DATA_PATHS = ("in-process", "direct", "auto")  # backends.DataPathChoice, as a job takes them


def _job_options(f: F) -> F:
    f = click.option("--listen", metavar="ADDR", default=None,
                     help="Address the coordinator listens on for its workers (default: the one the job's "
                          "first node reaches this host at).")(f)
    return click.option("--job", "job", metavar="JOBID", default=None,
                        help="The Slurm job (default: the allocation this runs in, $SLURM_JOB_ID).")(f)


def _deadline_options(f: F) -> F:
    for name, default, what in (("commit", 60.0, "every node's commit, and the final word"),
                                ("prepare", 300.0, "every rank locked, backed up and dumped (restore: restored)"),
                                ("connect", 60.0, "every node's worker started and connected")):
        f = click.option(f"--{name}-timeout", type=Seconds(min=1), default=default, show_default=True,
                         metavar="SECONDS", help=f"Deadline for {what}.")(f)
    return f


def _absolute(ctx: click.Context, param: click.Parameter, value: Optional[Path]) -> Optional[Path]:
    if value is not None and not value.is_absolute():
        raise click.BadParameter("must be an absolute path: it names a directory on every node")
    return value


@click.group()
def job() -> None:
    """Checkpoint and restore every rank of a multi-node Slurm job."""


@job.command("checkpoint")
@click.option("-D", "--directory", required=True, type=click.Path(path_type=Path),
              help="The job checkpoint to create, on storage every node shares (must not exist).")
@_job_options
@click.option("--leave-running", is_flag=True, help="Keep every rank running after the checkpoint.")
@click.option("--live", is_flag=True,
              help="With --leave-running (implied): each node's ranks are stopped only while their images are "
                   "written to memory (--live-staging, on each node), then copied to DIRECTORY while they run "
                   "on; a node whose ranks' images would not fit there takes an ordinary --leave-running "
                   "checkpoint of them, with a warning.")
@click.option("--live-staging", type=click.Path(path_type=Path), default=Path("/dev/shm"), show_default=True,
              metavar="DIR", callback=_absolute, help="The tmpfs directory, on every node, a --live checkpoint's "
                                                      "images are staged in.")
@click.option("--shell-job", is_flag=True, help="The ranks share a terminal or session with their launcher.")
@click.option("--lock-timeout", type=Seconds(min=0.1), default=60.0, show_default=True, metavar="SECONDS",
              help="How long each rank's device work may take to quiesce.")
@click.option("--criu-timeout", type=Seconds(min=1), default=None, metavar="SECONDS",
              help="Bound on each CRIU dump (default: CRIU's).")
@click.option("--dedup", is_flag=True,
              help="Keep every rank's host pages as chunks, each stored once, in DIRECTORY/nodes/.npusnap-store.")
@click.option("--compress", type=click.Choice(COMPRESS), default="none", show_default=True,
              help="Compress every rank's host pages (with the in-process data path: its device memory too; "
                   "with --data-path direct: its device images) in that store (zstd, lz4: imply --dedup); auto "
                   "only direct device images, where compressing beats the disk.")
@click.option("--data-path", type=click.Choice(DATA_PATHS), default="in-process",
              show_default=True,
              help="How device memory is saved: through each rank (in-process) or by the daemon (direct, which "
                   "--parent needs; auto: direct for each rank whose runtime offers it).")
@click.option("--parent", type=click.Path(path_type=Path), default=None, metavar="JOBDIR",
              help="Incremental: each rank writes only the device memory changed since its images in job "
                   "checkpoint JOBDIR (the same ranks, their device images taken by the direct data path) and "
                   "references the rest (implies --data-path direct; exit 8 if JOBDIR cannot be its parent).")
@click.option("--stage", metavar="DIR", default=None, type=click.Path(path_type=Path), callback=_absolute,
              help="Dump each node's ranks into a fresh directory under this node-local DIR first, then copy "
                   "them to DIRECTORY before the node votes (with --leave-running the ranks run on before "
                   "the copy; with --dedup/--compress their chunks go into DIRECTORY's store).")
@_deadline_options
@json_option
@click.pass_obj
def checkpoint(term: Terminal, directory: Path, job: Optional[str], listen: Optional[str], leave_running: bool,
               live: bool, live_staging: Path, shell_job: bool, lock_timeout: float, criu_timeout: Optional[float],
               dedup: bool, compress: str, data_path: str, parent: Optional[Path], stage: Optional[Path],
               connect_timeout: float, prepare_timeout: float, commit_timeout: float) -> None:
    """Checkpoint every rank of the job on every node into DIRECTORY, all or nothing.

    One worker per node (srun --overlap) locks, backs up and dumps its node's ranks and votes;
    the job manifest is committed only when every node voted. Any failure, timeout or lost
    worker before that aborts: every rank runs on, unlocked, and DIRECTORY does not exist.
    """
    from ..core.job.coordinator import Deadlines, JobCheckpointOptions, checkpoint_job

    if live and compress != "none":
        raise click.UsageError("--live and --compress both stage the images in memory: give one of them")
    leave_running = leave_running or live
    opts = JobCheckpointOptions(directory=directory, job=job, listen=listen, leave_running=leave_running,
                                live_staging=live_staging if live else None,
                                shell_job=shell_job, lock_timeout=lock_timeout, criu_timeout=criu_timeout,
                                deadlines=Deadlines(connect_timeout, prepare_timeout, commit_timeout), stage=stage,
                                dedup=dedup, compress=compress, data_path=data_path, parent=parent)
    r = checkpoint_job(opts, term.info)
    m = r.manifest
    if term.json_mode:
        term.data("job-checkpoint", {"directory": str(r.directory), "job": m.slurm_job_id,
                                     "left_running": leave_running, "live": live, "downtime_s": r.downtime,
                                     "stage": str(stage) if stage else None,
                                     "seconds": round(r.seconds, 6),
                                     "stages": r.stages, "nodes": [n.__dict__ for n in m.nodes],
                                     "ranks": [x.__dict__ for x in m.ranks]})
        return
    term.success(f"checkpointed job {m.slurm_job_id}: {len(m.ranks)} ranks on {len(m.nodes)} nodes into "
                 f"{r.directory} ({r.seconds:.2f}s)")
    if r.downtime is not None:
        term.info(f"{'live' if live else 'left running'}: the ranks were stopped for {r.downtime:.2f}s at most")
    if not leave_running:
        term.info(f"the ranks were stopped; `npusnap job restore {r.directory}` in a new allocation brings them back")


@job.command("restore")
@click.argument("directory", type=click.Path(path_type=Path))
@_job_options
@click.option("--nodes", metavar="NODE,NODE...", default=None,
              help="The allocation's nodes in rank order: the checkpoint's first node's ranks go to the first "
                   "(default: Slurm's order).")
@click.option("--no-verify", is_flag=True, help="Check the manifests' checksums only, not every file's.")
@click.option("--lazy", is_flag=True,
              help="Every rank runs before its memory is back: host pages on first touch (CRIU lazy-pages), "
                   "device memory on first touch and in the background (npusim, a checkpoint taken with "
                   "--data-path direct), all of it checked. A chunk that fails its checksum makes the "
                   "command exit 8 once the ranks have exited.")
@_deadline_options
@json_option
@click.pass_obj
def restore(term: Terminal, directory: Path, job: Optional[str], listen: Optional[str], nodes: Optional[str],
            no_verify: bool, lazy: bool, connect_timeout: float, prepare_timeout: float,
            commit_timeout: float) -> None:
    """Restore the job checkpoint DIRECTORY into a (new) allocation and wait for the ranks.

    Needs as many nodes as the checkpoint has; each node's ranks are restored on one node of
    the allocation. Exits with the first non-zero exit code of a rank (0 when all succeed).
    """
    from ..core.job.coordinator import Deadlines, JobRestoreOptions, restore_job
    from ..errors import ImageInvalid

    opts = JobRestoreOptions(directory=directory, job=job, listen=listen,
                             nodes=nodes.split(",") if nodes else None, verify=not no_verify, lazy=lazy,
                             deadlines=Deadlines(connect_timeout, prepare_timeout, commit_timeout))
    r = restore_job(opts, term.info)
    problems = [p for n in r.lazy.values() for p in n.get("problems", [])]
    for p in problems:
        term.warn(p)
    if term.json_mode:
        term.data("job-restore", {"directory": str(directory.absolute()), "placement": r.placement,
                                  "pids": r.pids, "exit_codes": r.codes, "exit_code": r.exit_code,
                                  "stages": r.stages, "lazy": r.lazy if lazy else None})
    else:
        term.success(f"job restored from {directory} ("
                     + ", ".join(f"{a} -> {b}" for a, b in r.placement.items())
                     + f"); the ranks exited {r.exit_code}")
    if problems:
        raise ImageInvalid(problems[0], "the job checkpoint is damaged: restore another one (npusnap job verify DIR)")
    raise SystemExit(r.exit_code)


@job.command("status")
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
def status(term: Terminal, directory: Path) -> None:
    """Whether DIRECTORY is a committed job checkpoint, or one being written (or left over)."""
    from ..core.job import manifest as jm
    from ..errors import ImageInvalid
    from ..image.format import HIDDEN_SIBLING

    root = directory.absolute()
    partial = sorted(p.name for p in root.parent.glob(f".{root.name}.*")
                     if (mt := HIDDEN_SIBLING.match(p.name)) and mt.group("kind") == "partial")
    state, detail, m = "absent", "", None
    if root.exists():
        try:
            m = jm.verify(root, deep=False)
            state = "committed"
        except ImageInvalid as e:
            state, detail = "invalid", e.message
    if term.json_mode:
        term.data("job-status", {"directory": str(root), "state": state, "detail": detail, "partial": partial,
                                 "job": m.slurm_job_id if m else None, "ranks": len(m.ranks) if m else 0,
                                 "nodes": [n.name for n in m.nodes] if m else []})
        return
    if m is not None:
        term.success(f"{root}: committed job checkpoint of job {m.slurm_job_id}, {len(m.ranks)} ranks on "
                     f"{', '.join(n.name for n in m.nodes)} ({m.created})")
    else:
        term.info(f"{root}: {state}" + (f" ({detail})" if detail else ""))
    for p in partial:
        term.info(f"  {p}: a job checkpoint being written, or left by a coordinator that died (not committed)")


@job.command("inspect")
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
def inspect(term: Terminal, directory: Path) -> None:
    """Show a job checkpoint: nodes, ranks, their images and devices, stage timings."""
    from ..core.job import manifest as jm
    from ..image.format import load_manifest

    root = directory.absolute()
    m = jm.verify(root, deep=False)
    nodes = {n.name: load_manifest(root / n.dir) for n in m.nodes}
    sizes = {name: sum(f.size for f in nm.files) for name, nm in nodes.items()}
    stored = {name: _stored(nm.options) for name, nm in nodes.items()}
    if term.json_mode:
        term.data("job-inspect", {"directory": str(root), **m.to_dict(), "node_bytes": sizes,
                                  "node_stored_bytes": stored})
        return
    term.success(f"job {m.slurm_job_id}: {len(m.ranks)} ranks on {len(m.nodes)} nodes, created {m.created}")
    if m.parent is not None:
        term.info(f"  incremental: parent job checkpoint {m.parent} (every rank's device images reference its)")
    for n in m.nodes:
        packed = "" if stored[n.name] is None else f" ({human_bytes(stored[n.name] or 0)} new in the chunk store)"
        term.info(f"  node {n.name} ({n.address}): {n.dir}, {human_bytes(sizes[n.name])}{packed}, "
                  f"manifest sha256 {n.manifest_sha256[:16]}...")
        for r in m.ranks_of(n.name):
            dev = r.device.get("backend", "none")
            term.info(f"    rank {r.rank} (step {r.step} task {r.procid}): pid {r.pid}, {r.images}, device {dev} "
                      f"{human_bytes(int(r.device.get('bytes', 0)))}")
    term.info("  stages: " + ", ".join(f"{s['name']} {s['seconds']:.2f}s" for s in m.phases))


def _stored(options: dict[str, Any]) -> Optional[int]:
    """What a node's checkpoint added to the chunk store (--dedup, --compress), or None."""
    parts = [options.get(k) for k in ("host_pages", "device_images")]
    figures = [int(p.get("new_bytes", 0)) for p in parts if isinstance(p, dict)]
    return sum(figures) if figures else None


@job.command("verify")
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
def verify(term: Terminal, directory: Path) -> None:
    """Recompute every checksum of every node's checkpoint in a job checkpoint."""
    from ..core.job import manifest as jm
    from ..image.chain import ancestors
    from ..image.format import load_manifest

    root = directory.absolute()
    m = jm.verify(root, deep=True)  # an incremental one's chains too, every link's every file
    chains = {n.name: [str(p) for p, _ in ancestors(root / n.dir, load_manifest(root / n.dir))] for n in m.nodes}
    if term.json_mode:
        term.data("job-verify", {"directory": str(root), "valid": True,
                                 "nodes": [n.name for n in m.nodes], "ranks": len(m.ranks), "chains": chains})
        return
    links = max((len(c) for c in chains.values()), default=0)
    term.success(f"{directory}: {len(m.nodes)} nodes, {len(m.ranks)} ranks, all checksums match"
                 + (f" (and those of the {links} job checkpoints up the chain)" if links else ""))


@job.group("worker", hidden=True)
def worker() -> None:
    """The per-node worker (started by `job checkpoint` / `job restore` through srun)."""


def _worker_options(f: F) -> F:
    f = click.option("--coordinator", required=True, metavar="HOST:PORT")(f)
    f = click.option("--run", "run_id", required=True)(f)
    f = click.option("--secret-file", required=True, type=click.Path(path_type=Path))(f)
    return click.option("--lease", type=Seconds(min=1), required=True)(f)


@worker.command("checkpoint")
@_worker_options
@click.option("--job", "job_id", required=True)
@click.option("--staging", required=True, type=click.Path(path_type=Path))
@click.option("--leave-running", is_flag=True)
@click.option("--live-staging", type=click.Path(path_type=Path), default=None)
@click.option("--shell-job", is_flag=True)
@click.option("--lock-timeout", type=Seconds(min=0.1), default=60.0)
@click.option("--criu-timeout", type=Seconds(min=1), default=None)
@click.option("--rendezvous", type=click.Path(path_type=Path), default=None)
@click.option("--dedup", is_flag=True)
@click.option("--compress", type=click.Choice(COMPRESS), default="none")
@click.option("--data-path", type=click.Choice(DATA_PATHS), default="in-process")
@click.option("--parent", type=click.Path(path_type=Path), default=None)
@click.option("--stage", type=click.Path(path_type=Path), default=None)
def worker_checkpoint(coordinator: str, run_id: str, secret_file: Path, lease: float, job_id: str, staging: Path,
                      leave_running: bool, live_staging: Optional[Path], shell_job: bool, lock_timeout: float,
                      criu_timeout: Optional[float], rendezvous: Optional[Path], dedup: bool, compress: str,
                      data_path: str, parent: Optional[Path], stage: Optional[Path]) -> None:
    from ..core.job.worker import WorkerOptions, checkpoint_worker, run_worker

    run_worker(lambda: checkpoint_worker(WorkerOptions(
        coordinator=coordinator, run=run_id, secret_file=secret_file, lease=lease, job=job_id, staging=staging,
        leave_running=leave_running, live_staging=live_staging, shell_job=shell_job, lock_timeout=lock_timeout,
        criu_timeout=criu_timeout, rendezvous=rendezvous, dedup=dedup, compress=compress, data_path=data_path,
        parent=parent, stage=stage)))


@worker.command("restore")
@_worker_options
@click.option("--directory", required=True, type=click.Path(path_type=Path))
@click.option("--rendezvous", type=click.Path(path_type=Path), default=None)
@click.option("--lazy", is_flag=True)
def worker_restore(coordinator: str, run_id: str, secret_file: Path, lease: float, directory: Path,
                   rendezvous: Optional[Path], lazy: bool) -> None:
    from ..core.job.worker import WorkerOptions, restore_worker, run_worker

    run_worker(lambda: restore_worker(WorkerOptions(coordinator=coordinator, run=run_id, secret_file=secret_file,
                                                    lease=lease, directory=directory, rendezvous=rendezvous,
                                                    lazy=lazy)))
