"""The coordinator of a job checkpoint or restore: one per job command, inside the allocation
(the batch script) or outside it (given the job id). It starts one worker per node through
srun, talks to them over TCP (protocol.py), and drives the two-phase commit:

    connect   every node's worker says hello (the ranks it found)       --connect-timeout
    prepare   every worker locks, backs up, dumps its node's ranks and votes   --prepare-timeout
    commit    `commit` to all -> every node's set committed into the staging directory
              -> job.json written -> the staging directory renamed to DIR (THE commit point)
              -> `done` to all (ranks killed, or run on)                 --commit-timeout
    any failure, timeout or lost worker before the rename -> `abort` to every worker (each
    undoes its ranks: they run on, unlocked), the staging directory removed, JobAborted.
    HCCL ranks restored in place (an abort after the backup, --leave-running) re-form their
    communicators across nodes in the attempt's one rendezvous directory beside DIR.

Restore: the shape is checked (as many nodes as the checkpoint has), node i of the checkpoint
goes to node i of the new allocation (or of --nodes), every worker restores its node's set,
and `go` once all are restored (else `abort`: every restored rank killed, DIR intact); the
command then waits for the ranks to exit and returns the first non-zero exit code."""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ... import __version__
from ...errors import (
    ImageInvalid,
    JobAborted,
    JobBusy,
    NpusnapError,
    PermissionProblem,
    StorageProblem,
    UnsupportedTarget,
    WrongState,
)
from ...image.checksums import fsync_path  # the same durability step as a single checkpoint's commit
from ...image.format import hidden_sibling
from ..signals import Signals
from . import manifest as jm
from . import owners, slurm
from .protocol import Channel, ProtocolError, new_secret

Say = Callable[[str], None]


@dataclass
class Deadlines:
    connect: float = 60.0
    prepare: float = 300.0
    commit: float = 60.0

    @property
    def lease(self) -> float:
        """How long a worker waits for the coordinator's next word before aborting by itself."""
        return self.prepare + self.commit


@dataclass
class JobCheckpointOptions:
    directory: Path
    job: Optional[str] = None
    listen: Optional[str] = None
    leave_running: bool = False
    live_staging: Optional[Path] = None  # --live (with leave_running): each node's tmpfs to stage its ranks' images in
    shell_job: bool = False
    lock_timeout: float = 60.0
    criu_timeout: Optional[float] = None
    deadlines: Deadlines = field(default_factory=Deadlines)
    stage: Optional[Path] = None  # a node-local directory each worker writes its node to first (writebehind.py)
    dedup: bool = False  # every rank's host pages into the node checkpoints' chunk store (nodes/.npusnap-store)
    compress: str = "none"  # auto | zstd | lz4 | none: passed to every node's set
    data_path: str = "in-process"  # in-process | direct (the daemon moves device memory) | auto (direct where offered)
    parent: Optional[Path] = None  # incremental: each rank's images reference this job checkpoint's (implies direct)


@dataclass
class JobRestoreOptions:
    directory: Path
    job: Optional[str] = None
    listen: Optional[str] = None
    nodes: Optional[list[str]] = None  # the new allocation's nodes in rank order (default Slurm's)
    verify: bool = True
    lazy: bool = False  # every rank runs before its memory is back (each node's set restored --lazy)
    deadlines: Deadlines = field(default_factory=Deadlines)


@dataclass
class Event:
    node: Optional[str]
    msg: Optional[dict[str, Any]]  # None: the worker's connection was lost
    why: str = ""


# A worker's failure of these kinds stays that kind (every rank is undone all the same): a refusal
# because another job checkpoint runs, or for ranks of several users; a full or broken shared
# directory, one swapped under us, an unsafe --stage. Any other is JobAborted.
_KEPT_KINDS: dict[str, type[NpusnapError]] = {"JobBusy": JobBusy, "StorageProblem": StorageProblem,
                                              "UnsupportedTarget": UnsupportedTarget,
                                              "PermissionProblem": PermissionProblem,  # an unsafe --stage
                                              "ImageInvalid": ImageInvalid}  # a --parent that cannot serve


def _worker_failure(stage: str, node: str, msg: dict[str, Any], note: str = "") -> NpusnapError:
    kind = _KEPT_KINDS.get(str(msg.get("error_kind")), JobAborted)
    return kind(f"{stage}: the worker on {node} failed: {msg.get('error')}{note}",
                kind.default_hint if kind is JobBusy else JobAborted.default_hint)


def _failed_after_commit(final: Path, node: str, msg: dict[str, Any]) -> NpusnapError:
    """A worker that failed once the job checkpoint was committed (its ranks did not all run on,
    or were not killed): the checkpoint stands, the error keeps its kind."""
    from ... import errors

    kind = getattr(errors, str(msg.get("error_kind")), None)
    kind = kind if isinstance(kind, type) and issubclass(kind, NpusnapError) else NpusnapError
    return kind(f"the job checkpoint {final} was committed, but the worker on {node} failed after it: "
                f"{msg.get('error')}", f"see the workers' lines above; `npusnap recover PID` on {node} brings "
                                       "back a rank that is not running")


def _worker_command() -> list[str]:
    return [sys.executable, "-m", "npusnap_cli", "job", "worker"]


class Session:
    """The listener, the srun step of workers, and one reader thread per worker connection."""

    def __init__(self, job: str, nodes: Sequence[str], listen: Optional[str], key: bytes, say: Say) -> None:
        self.job, self.nodes, self.key, self.say = job, list(nodes), key, say
        self.run = secrets.token_hex(8)
        addr = listen or slurm.local_address_towards(slurm.node_address(self.nodes[0]))
        self.listener = socket.create_server((addr, 0), backlog=len(self.nodes) + 8)
        self.address = f"{addr}:{self.listener.getsockname()[1]}"
        say(f"npusnap job: coordinator of job {job} listening on {self.address}")
        self.events: queue.Queue[Event] = queue.Queue()
        self.channels: dict[str, Channel] = {}
        self.output: list[str] = []
        self.step: Optional[subprocess.Popen[str]] = None
        self._closing = False
        self.lost: dict[str, str] = {}  # node -> why its worker's connection is gone
        # a worker's messages ahead of the stage being gathered (it voted while a slower node had
        # not said hello yet: one waiting for a job restore under way): kept for the next gather
        self.ahead: list[Event] = []
        self.aborted: Optional[str] = None  # why, once abort() was called: late workers hear it too
        self._lock = threading.Lock()
        self.step_ended = ""
        threading.Thread(target=self._accept, daemon=True, name="job-accept").start()

    # -- workers
    def start_workers(self, args: Sequence[str]) -> None:
        argv = slurm.worker_step(self.job, self.nodes, [*_worker_command(), *args, "--coordinator", self.address,
                                                        "--run", self.run])
        env = {k: v for k, v in os.environ.items() if k not in ("SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE")}
        self.step = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        threading.Thread(target=self._collect, daemon=True, name="job-srun").start()

    def _collect(self) -> None:
        assert self.step is not None and self.step.stdout is not None
        for line in self.step.stdout:
            line = line.rstrip()
            self.output.append(line)
            self.say(line)
        code = self.step.wait()
        self.events.put(Event(None, None, f"the workers' srun step ended (exit {code})"))

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn, peer), daemon=True).start()

    def _read(self, conn: socket.socket, peer: Any) -> None:
        ch = Channel(conn, self.key, self.run)
        try:
            hello = ch.receive(timeout=30)
            node = str(hello.get("node"))
            if hello.get("type") != "hello" or node not in self.nodes or node in self.channels:
                raise ProtocolError(f"an unexpected first message from {node!r}")
        except ProtocolError as e:
            self.say(f"npusnap job: refused a connection from {peer[0]}: {e}")
            ch.close()
            return
        with self._lock:
            self.channels[node] = ch
            if self.aborted is not None:
                with contextlib.suppress(OSError):
                    ch.send("abort", reason=self.aborted)
        self.events.put(Event(node, hello))
        while True:
            try:
                msg = ch.receive()
            except ProtocolError as e:
                self.events.put(Event(node, None, f"lost the worker on {node} ({e})"))
                return
            self.events.put(Event(node, msg))

    # -- stages
    def gather(self, wanted: str, stage: str, timeout: Optional[float],
               failed: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, dict[str, Any]]:
        """A `wanted` message from every node within timeout (None: no bound); JobAborted when a
        worker fails, is lost, or the time runs out. failed: where a worker's failure is kept
        instead (after the commit, nothing is undone for it)."""
        waiting = set(self.nodes)
        got: dict[str, dict[str, Any]] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        replay, self.ahead = self.ahead, []
        while waiting:
            lost = sorted(waiting & set(self.lost))
            if lost:
                raise JobAborted(f"{stage}: {self.lost[lost[0]]}{self._job_ended()}")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                why = (self.step_ended + self._job_ended()) if self.step_ended else \
                    f"no answer within {timeout:.0f} s (--{stage}-timeout)"
                raise JobAborted(f"{stage}: {', '.join(sorted(waiting))}: {why}")
            try:
                ev = replay.pop(0) if replay else self.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev.node is None:  # srun ended: the workers' last messages may still be on their way
                self.step_ended = ev.why
                grace = time.monotonic() + 5
                deadline = grace if deadline is None else min(deadline, grace)
            elif ev.msg is None:
                self.lost[ev.node] = ev.why
            elif ev.msg["type"] == "failed" and failed is not None:
                failed[ev.node] = ev.msg
                waiting.discard(ev.node)
            elif ev.msg["type"] == "failed":
                raise _worker_failure(stage, ev.node, ev.msg, self._job_ended())
            elif ev.msg["type"] == wanted and ev.node in waiting:
                waiting.discard(ev.node)
                got[ev.node] = ev.msg
            else:
                self.ahead.append(ev)
        return got

    def _job_ended(self) -> str:
        """Why the workers went when it is because the job itself ended (its ranks finished, or
        it was cancelled): Slurm ends every step of a job that ends, the workers' too."""
        state = slurm.job_state(self.job)
        if state == "RUNNING":
            return ""
        return f"; job {self.job} ended meanwhile ({state or 'no longer known to Slurm'}), and Slurm ended its workers"

    def broadcast(self, kind: str, **fields: Any) -> None:
        with self._lock:
            for ch in list(self.channels.values()):
                with contextlib.suppress(OSError):
                    ch.send(kind, **fields)

    def abort(self, reason: str) -> None:
        """`abort` to every worker, now and to any that connects later."""
        with self._lock:
            self.aborted = reason
        self.broadcast("abort", reason=reason)

    def close(self, wait: float) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self.listener.close()
        if self.step is not None:
            try:
                self.step.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.step.pid, 9)
                self.step.wait()
        for ch in self.channels.values():
            ch.close()


# ---------------------------------------------------------------- checkpoint


@dataclass
class CheckpointResult:
    manifest: jm.JobManifest
    directory: Path
    seconds: float
    stages: list[dict[str, Any]]

    @property
    def downtime(self) -> Optional[float]:
        """The longest any rank was stopped (--leave-running, --live); None: the ranks were stopped."""
        return max((r.downtime for r in self.manifest.ranks if r.downtime is not None), default=None)


def checkpoint_job(opts: JobCheckpointOptions, say: Say) -> CheckpointResult:
    job = slurm.job_id(opts.job)
    nodes = slurm.job_nodes(job)
    final = opts.directory.absolute()
    if final.exists() or final.is_symlink():
        raise StorageProblem(f"{final} already exists", "choose a new directory for each job checkpoint")
    if not final.parent.is_dir():
        raise StorageProblem(f"{final.parent} is not a directory", "create it on the shared storage first")
    parent = _check_parent(opts)
    ranks_user = owners.hand_over(slurm.job_user(job))
    staging = hidden_sibling(final, "partial")  # made inside the try below, whose end removes it
    started = time.monotonic()
    stages: list[dict[str, Any]] = []
    committed = False
    session: Optional[Session] = None
    meet: Optional[Path] = None
    d = opts.deadlines

    def stage(name: str, t0: float) -> None:
        stages.append({"name": name, "seconds": round(time.monotonic() - t0, 6)})

    with Signals() as signals:  # left ignoring signals once the commit settled the outcome
        try:
            key = _staging(staging, ranks_user)
            session = Session(job, nodes, opts.listen, key, say)
            meet = _attempt_rendezvous(final, ranks_user)
            t = time.monotonic()
            session.start_workers(_checkpoint_worker_args(job, opts, staging, meet))
            hellos = session.gather("hello", "connect", d.connect)
            stage("connect", t)
            _check_parent_ranks(opts, parent, hellos)
            for node in nodes:
                say(f"npusnap job: {node}: ranks " + ", ".join(
                    f"{r['pid']} (step {r['step']} task {r['procid']})" for r in hellos[node]["ranks"]))
            t = time.monotonic()
            votes = session.gather("prepared", "prepare", d.prepare)
            stage("prepare", t)
            t = time.monotonic()
            session.broadcast("commit")
            acks = session.gather("committed", "commit", d.commit)
            m = _job_manifest(job, nodes, staging, hellos, votes, acks)
            m.phases = stages
            m.parent = None if opts.parent is None else os.path.relpath(opts.parent.absolute(), final)
            jm.write(staging, m)
            (staging / jm.SECRET).unlink()
            testhooks_commit()
            with signals.commit_point():  # a Ctrl-C from here on never reports "rolled back" for a committed one
                if final.exists():
                    raise StorageProblem(f"{final} appeared while the job was checkpointed")
                os.rename(staging, final)  # THE commit point
                committed = True
            fsync_path(final.parent)
            stage("commit", t)
            _finish(session, final, m, stages, d.commit)
            return CheckpointResult(m, final, time.monotonic() - started, stages)
        except BaseException as e:
            if committed:
                raise
            signals.rolling_back = True  # a second Ctrl-C must not cut the abort short
            if session is not None:
                session.abort(str(getattr(e, "message", e)) or type(e).__name__)
            if isinstance(e, OSError):
                raise StorageProblem(f"the job checkpoint could not be committed: {e}") from e
            raise
        finally:
            if session is not None:
                session.close(wait=d.commit + 30)
            if meet is not None:  # every worker ended: no rank restores in place any more
                shutil.rmtree(meet, ignore_errors=True)
            if not committed:
                shutil.rmtree(staging, ignore_errors=True)


def _finish(session: Session, final: Path, m: jm.JobManifest, stages: list[dict[str, Any]], deadline: float) -> None:
    """After the commit: `done` to every worker (each kills its ranks, or runs them on from their
    images in final), their downtimes and the finish's time into the job manifest. A worker that
    failed at it is reported, the job checkpoint standing."""
    session.broadcast("done", directory=str(final))
    t = time.monotonic()
    finished: dict[str, dict[str, Any]] = {}
    late: dict[str, dict[str, Any]] = {}  # workers that failed after the commit (their ranks' run-on)
    with contextlib.suppress(JobAborted):  # committed: a worker that ends early costs nothing
        finished = session.gather("finished", "finish", deadline, failed=late)
    stages.append({"name": "finish", "seconds": round(time.monotonic() - t, 6)})
    _downtimes(m, finished)
    m.phases = stages
    jm.write(final, m)  # the timings of the finish too (same content otherwise)
    if late:
        raise _failed_after_commit(final, *sorted(late.items())[0])


def _staging(staging: Path, ranks_user: Optional[owners.Owner]) -> bytes:
    """The attempt's staging directory (renamed to DIR at the commit) made, and the job's secret
    in it."""
    try:
        staging.mkdir(0o700)
        (staging / jm.NODES_DIR).mkdir(0o700)
        _ranks_can_reach(staging, ranks_user)
        return new_secret(staging / jm.SECRET)
    except NpusnapError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise StorageProblem(f"cannot create {staging}: {e.strerror}") from e


def _checkpoint_worker_args(job: str, opts: JobCheckpointOptions, staging: Path, meet: Path) -> list[str]:
    args = ["checkpoint", "--job", job, "--staging", str(staging), "--secret-file", str(staging / jm.SECRET),
            "--lease", str(opts.deadlines.lease), "--lock-timeout", str(opts.lock_timeout), "--rendezvous", str(meet)]
    if opts.criu_timeout:
        args += ["--criu-timeout", str(opts.criu_timeout)]
    args += ["--leave-running"] if opts.leave_running else []
    args += ["--live-staging", str(opts.live_staging)] if opts.live_staging is not None else []
    args += ["--stage", str(opts.stage)] if opts.stage is not None else []
    return args + (["--shell-job"] if opts.shell_job else []) + _store_worker_args(opts)


def _store_worker_args(opts: JobCheckpointOptions) -> list[str]:
    """--dedup, --compress, --data-path, --parent: as every node's worker passes them to its set."""
    args = (["--dedup"] if opts.dedup else []) + (["--compress", opts.compress] if opts.compress != "none" else [])
    args += ["--data-path", "direct" if opts.parent is not None else opts.data_path]
    return args + (["--parent", str(opts.parent.absolute())] if opts.parent is not None else [])


def _check_parent(opts: JobCheckpointOptions) -> Optional[jm.JobManifest]:
    """--parent: a committed job checkpoint, its manifests intact (each node's worker then checks
    its own node's images, and their chain, before it locks a rank)."""
    if opts.parent is None:
        return None
    if os.path.abspath(opts.parent) == os.path.abspath(opts.directory):
        raise ImageInvalid("--parent cannot be the job checkpoint's own directory")
    return jm.verify(opts.parent, deep=False)


def _check_parent_ranks(opts: JobCheckpointOptions, parent: Optional[jm.JobManifest],
                        hellos: dict[str, dict[str, Any]]) -> None:
    """The parent job checkpoint must hold as many ranks as the job runs (each node's worker
    matches its ranks to a node of the parent by their pids)."""
    ranks = sum(len(h["ranks"]) for h in hellos.values())
    if parent is not None and len(parent.ranks) != ranks:
        raise ImageInvalid(f"the parent job checkpoint {opts.parent} holds {len(parent.ranks)} ranks, the job runs "
                           f"{ranks}: it cannot be its parent", "take a full job checkpoint (no --parent)")


def _downtimes(m: jm.JobManifest, finished: dict[str, dict[str, Any]]) -> None:
    """Each rank's downtime as its worker measured it (ranks that ran on; stopped ones have none)."""
    for r in m.ranks:
        seconds = finished.get(r.node, {}).get("downtime", {}).get(str(r.pid))
        r.downtime = float(seconds) if seconds is not None else None


def _attempt_rendezvous(final: Path, ranks_user: Optional[owners.Owner]) -> Path:
    """The attempt's rendezvous directory, on the shared storage beside DIR (0700, a fresh random
    name: nobody plants a root there; the ranks' user's): where the HCCL ranks of every node re-form
    their communicators when the attempt restores them in place (an abort after the backup, a
    rollback, --leave-running). Beside the staging directory, not in it: its path outlives the
    commit's rename."""
    meet = hidden_sibling(final, "rendezvous")
    try:
        return owners.make_dir(meet.parent, meet.name, ranks_user)
    except StorageProblem as e:
        raise StorageProblem(f"cannot create the ranks' rendezvous directory: {e.message}") from e


def _ranks_can_reach(staging: Path, ranks_user: Optional[owners.Owner]) -> None:
    """DIR/rendezvous/, where a restore's ranks meet: theirs. When they are another user's than
    ours, DIR is 0711 for them to reach it (nothing else in it is theirs to read: 0600, 0700)."""
    owners.make_dir(staging, jm.RENDEZVOUS_DIR, ranks_user, parent_follows=False,
                    parent_mode=None if ranks_user is None else 0o711)


def testhooks_commit() -> None:
    from ... import testhooks

    testhooks.pause("job-commit")
    testhooks.fail("job-commit")


def _job_manifest(job: str, nodes: list[str], staging: Path, hellos: dict[str, dict[str, Any]],
                  votes: dict[str, dict[str, Any]], acks: dict[str, dict[str, Any]]) -> jm.JobManifest:
    from ...image.format import MANIFEST

    entries, ranks = [], []
    for node in nodes:
        rel = f"{jm.NODES_DIR}/{node}"
        sha = jm.sha256_of(staging / rel / MANIFEST)
        if sha != acks[node]["manifest_sha256"]:
            raise JobAborted(f"commit: node {node}'s manifest is not the one its worker committed")
        entries.append(jm.NodeEntry(name=node, address=slurm.node_address(node), dir=rel, manifest_sha256=sha,
                                    phases=votes[node].get("phases", [])))
        members = {m["pid"]: m for m in votes[node].get("members", [])}
        voted = acks[node].get("phases", [])  # the node's vote and commit: every rank of it took part in both
        for r in hellos[node]["ranks"]:
            member = members.get(r["pid"], {})
            ranks.append(jm.RankEntry(rank=-1, step=r["step"], procid=r["procid"], node=node, pid=r["pid"],
                                      images=f"{rel}/criu/{r['pid']}", device=member.get("device", {}),
                                      phases=[*member.get("phases", []), *voted]))
    ranks.sort(key=lambda r: (r.step, r.procid))
    for i, r in enumerate(ranks):
        r.rank = i
    entries.sort(key=lambda n: min((r.rank for r in ranks if r.node == n.name), default=0))
    return jm.JobManifest(slurm_job_id=job, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          npusnap_version=__version__, nodes=entries, ranks=ranks)


# ---------------------------------------------------------------- restore


@dataclass
class RestoreResult:
    manifest: jm.JobManifest
    placement: dict[str, str]  # checkpoint node -> new node
    pids: dict[str, list[int]]
    codes: dict[str, dict[str, int]]
    stages: list[dict[str, Any]]
    lazy: dict[str, dict[str, Any]] = field(default_factory=dict)  # --lazy: each node's (seconds, problems)

    @property
    def exit_code(self) -> int:
        return next((c for n in self.codes.values() for c in n.values() if c != 0), 0)


def placement(m: jm.JobManifest, nodes: list[str], wanted: Optional[list[str]]) -> dict[str, str]:
    """Checkpoint node -> new node, by rank order; refused when the shape does not fit."""
    order = wanted or nodes
    if wanted and sorted(wanted) != sorted(nodes):
        raise WrongState(f"--nodes {','.join(wanted)} are not the job's nodes ({','.join(nodes)})",
                         "name each node of the new allocation once")
    if len(order) != len(m.nodes):
        per = "/".join(str(len(m.ranks_of(n.name))) for n in m.nodes)
        raise WrongState(f"the job checkpoint has {len(m.ranks)} ranks on {len(m.nodes)} nodes ({per} per node); "
                         f"the new allocation has {len(order)} node(s)",
                         f"submit the restoring job with --nodes={len(m.nodes)}")
    return {n.name: new for n, new in zip(m.nodes, order)}


def restore_job(opts: JobRestoreOptions, say: Say) -> RestoreResult:
    root = opts.directory.absolute()
    m = jm.verify(root, deep=opts.verify)
    job = slurm.job_id(opts.job)
    nodes = slurm.job_nodes(job)
    place = placement(m, nodes, opts.nodes)
    d = opts.deadlines
    private = Path(tempfile.mkdtemp(prefix=f".{root.name}.restore-", dir=root.parent))
    stages: list[dict[str, Any]] = []
    session: Optional[Session] = None
    meet: Optional[Path] = None
    try:
        key = new_secret(private / jm.SECRET)
        session = Session(job, list(place.values()), opts.listen, key, say)
        t = time.monotonic()
        meet = _rendezvous(root / m.rendezvous, session.run, owners.hand_over(slurm.job_user(job)))
        session.start_workers(["restore", "--directory", str(root), "--secret-file", str(private / jm.SECRET),
                               "--lease", str(d.lease), "--rendezvous", str(meet), *(["--lazy"] if opts.lazy else [])])
        session.gather("hello", "connect", d.connect)
        stages.append({"name": "connect", "seconds": round(time.monotonic() - t, 6)})
        t = time.monotonic()
        for old, new in place.items():
            ranks = [{"pid": r.pid, "step": r.step, "procid": r.procid} for r in m.ranks_of(old)]
            session.channels[new].send("restore", dir=m.node(old).dir, from_node=old, ranks=ranks)
        restored = session.gather("restored", "restore", d.prepare)
        shutil.rmtree(meet, ignore_errors=True)  # every communicator re-formed: nobody meets there again
        session.broadcast("go")
        stages.append({"name": "restore", "seconds": round(time.monotonic() - t, 6)})
        pids = {new: list(restored[new]["pids"]) for new in place.values()}
        say("npusnap job: restored " + "; ".join(f"{old} -> {new}: {' '.join(map(str, pids[new]))}"
                                               for old, new in place.items()))
        exited = session.gather("exited", "run", None)
        codes = {n: {k: int(v) for k, v in e["codes"].items()} for n, e in exited.items()}
        return RestoreResult(m, place, pids, codes, stages, {n: e["lazy"] for n, e in exited.items() if "lazy" in e})
    except BaseException as e:
        if session is not None:
            session.abort(str(getattr(e, "message", e)) or type(e).__name__)
        raise
    finally:
        if session is not None:
            session.close(wait=d.commit + 30)
        shutil.rmtree(private, ignore_errors=True)
        if meet is not None:
            shutil.rmtree(meet, ignore_errors=True)


def _rendezvous(parent: Path, run: str, ranks_user: Optional[owners.Owner]) -> Path:
    """A fresh directory of this restore's own under the job checkpoint's rendezvous/ (storage
    every node sees; the ranks' user's): the HCCL ranks of all nodes re-form their communicators
    there (rank 0 publishes its new root, the others wait for it). One per restore, so a retry
    never meets a root left by an earlier one; removed once every node has restored."""
    try:
        return owners.make_dir(parent, run, ranks_user, parent_follows=False)
    except StorageProblem as e:
        raise StorageProblem(f"cannot create the ranks' rendezvous directory: {e.message}",
                             "the job checkpoint's directory must be writable by whoever restores it") from e
