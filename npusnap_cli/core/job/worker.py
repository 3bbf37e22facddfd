"""The per-node worker of a job checkpoint or restore, started by the coordinator through srun
(one task per node). It finds its node's ranks, runs them as one process set
(core/processset.py) and takes part in the coordinator's two-phase commit:

    checkpoint:  hello (the ranks it chose) -> set: lock, backup, dump, seal
                 -> vote `prepared` and wait: `commit` -> the set committed into the job's
                 staging directory -> `committed` and wait: `done` -> ranks killed | run on
                 `abort`, a lost coordinator, or no word within --lease -> every rank undone
    restore:     hello -> `restore` (which node's checkpoint) -> set restored -> `restored`
                 -> `go`: wait for the ranks to exit, report their exit codes | `abort`: kill them

A worker that loses its coordinator (its connection closes, or nothing arrives within --lease)
aborts by itself: ranks that were not committed run on, unlocked. A worker whose set fails says
`failed` before it undoes its ranks, so that every node's HCCL ranks are restored in place at the
same time, meeting in the attempt's rendezvous directory (--rendezvous, the coordinator's)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from ... import testhooks
from ...errors import JobAborted, JobBusy, NpusnapError, StorageProblem
from ...image.format import MANIFEST, Manifest
from . import owners, writebehind
from .manifest import sha256_of
from .protocol import Channel, ProtocolError, read_secret
from .ranks import REGISTRY, Rank, find_ranks, register_restored, unregister_restored, wait_restored

if TYPE_CHECKING:
    from ..lazy import LazyRestore
    from ..processset import SetCheckpoint
    from ..progress import Event
    from ..restore import RestoreOptions


@dataclass
class WorkerOptions:
    coordinator: str  # HOST:PORT
    run: str
    secret_file: Path
    lease: float
    job: str = ""
    staging: Optional[Path] = None  # checkpoint: the job's staging directory
    directory: Optional[Path] = None  # restore: the job checkpoint
    leave_running: bool = False
    live_staging: Optional[Path] = None  # checkpoint: --live, staged in this tmpfs directory
    shell_job: bool = False
    lock_timeout: float = 60.0
    criu_timeout: Optional[float] = None
    # where the HCCL ranks of every node re-form their communicators: the restore's, or (checkpoint)
    # the attempt's, for the in-place restores of a rollback or of --leave-running
    rendezvous: Optional[Path] = None
    stage: Optional[Path] = None  # checkpoint: the node-local directory to write the set to first (--stage)
    extra: dict[str, Any] = field(default_factory=dict)
    dedup: bool = False  # checkpoint: the set's host pages into the chunk store (image/store.py)
    compress: str = "none"
    data_path: str = "in-process"  # checkpoint: in-process | direct (the daemon moves device memory) | auto
    parent: Optional[Path] = None  # checkpoint: the parent job checkpoint (incremental)
    lazy: bool = False  # restore: the ranks run before their memory is back (restore --lazy)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def say(text: str) -> None:
    sys.stderr.write(f"npusnap job worker {node_name()}: {text}\n")
    sys.stderr.flush()


def run_worker(work: Callable[[], int]) -> NoReturn:
    """A worker's exit: its failure said on its own lines (the coordinator relays them among its
    own, where an `npusnap: error:` line would read as the command's outcome)."""
    try:
        code = work()
    except NpusnapError as e:
        say(f"failed: {e.one_line()}")
        code = e.exit_code
    raise SystemExit(code)


def _connect(opts: WorkerOptions) -> Channel:
    host, _, port = opts.coordinator.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=min(opts.lease, 30))
    except (OSError, ValueError) as e:
        raise JobAborted(f"cannot reach the coordinator at {opts.coordinator}: {e}") from e
    return Channel(sock, read_secret(opts.secret_file), opts.run)


def _checkpoint_lock(job: str, node: str) -> int:
    """One job checkpoint per job and node at a time: an exclusive flock held for the worker's
    life (the kernel lets go of it when the worker dies, however). JobBusy when another holds it.
    Named by the cluster too: clusters that share a host (test clusters) reuse job ids and nodes."""
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "").replace("/", "_")
    path = REGISTRY / f"{cluster}.{job}.{node}.checkpoint.lock"
    try:
        REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StorageProblem(f"cannot open the job's lock {path}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JobBusy(f"another `npusnap job checkpoint` of job {job} is running on {node}") from None
    return fd


def _warnings(event: "Event") -> None:
    """The set's warnings on the worker's lines (a rank whose rollback failed says so there)."""
    from ..progress import Level, Message

    if isinstance(event, Message) and event.level == Level.WARNING:
        say(event.text)


def _failed(ch: Channel, node: str, e: NpusnapError) -> None:
    """The `failed` message, naming the error's kind (the coordinator keeps a refusal or a storage
    problem as what it is)."""
    with contextlib.suppress(OSError):
        ch.send("failed", node=node, error=e.one_line(), error_kind=type(e).__name__)


class _GateRuns:
    """How a gate runs its node's set, and what it reports after (each rank's downtime)."""

    set: "SetCheckpoint"

    def run(self, s: "SetCheckpoint") -> None:
        self.set = s
        s.execute()

    @property
    def downtime(self) -> dict[int, float]:
        """Seconds from each rank's lock until it ran again (--leave-running; none: stopped)."""
        return dict(self.set.downtime)


class _Gate(_GateRuns):
    """The set's two-phase commit hooks, answered by the coordinator. It also times this node's
    vote (from its vote to the coordinator's commit) and commit (from the commit to its ack)."""

    def __init__(self, ch: Channel, opts: WorkerOptions, node: str, ranks: list[Rank]) -> None:
        self.ch, self.opts, self.node, self.ranks = ch, opts, node, ranks
        self.voted = False
        self.set_committed = False
        self.job_committed = False  # the coordinator said `done`: the job checkpoint stands, whatever follows
        self.moved: Optional[Path] = None  # then: the node's directory in it (see committed())
        self.phases: list[dict[str, Any]] = []
        self._since = 0.0
        self.told = False  # the coordinator heard of this node's failure

    def _send(self, kind: str, **fields: Any) -> None:
        try:
            self.ch.send(kind, **fields)
        except OSError as e:  # a coordinator that died: undone like an abort
            raise JobAborted(f"lost the coordinator while sending {kind!r} ({e.strerror or e})") from e

    def _timed(self, name: str) -> None:
        now = time.monotonic()
        self.phases.append({"name": name, "seconds": round(now - self._since, 6)})
        self._since = now

    def _await(self, stage: str, wanted: str) -> dict[str, Any]:
        try:
            msg = self.ch.receive(timeout=self.opts.lease)
        except ProtocolError as e:
            raise JobAborted(f"lost the coordinator while waiting for its {stage} decision ({e})") from e
        if msg["type"] == "abort":
            raise JobAborted(f"the coordinator aborted the job checkpoint: {msg.get('reason', '?')}")
        if msg["type"] != wanted:
            raise JobAborted(f"the coordinator sent {msg['type']!r} where {wanted!r} was due")
        return msg

    def prepared(self, manifest: Manifest) -> None:
        testhooks.job_point("vote", self.node)
        self._since = time.monotonic()
        self._send("prepared", node=self.node, members=self._members(manifest),
                   phases=[p.__dict__ for p in manifest.phases])
        self.voted = True
        self._await("commit", "commit")
        self._timed("vote")

    def _members(self, manifest: Manifest) -> list[dict[str, Any]]:
        return [{"pid": m.pid, "device": m.device.__dict__, "phases": [p.__dict__ for p in m.phases]}
                for m in manifest.members]

    def failing(self, error: BaseException) -> None:
        if not isinstance(error, JobAborted):  # the coordinator's word (or its loss): nothing to tell it
            self.tell(error)

    def tell(self, error: BaseException) -> None:
        """`failed` to the coordinator, once."""
        if self.told:
            return
        self.told = True
        if isinstance(error, NpusnapError):
            _failed(self.ch, self.node, error)
        else:
            with contextlib.suppress(OSError):
                self.ch.send("failed", node=self.node, error=str(error) or type(error).__name__)

    def committed(self, manifest: Manifest) -> Optional[Path]:
        """The node's directory in the committed job checkpoint (the coordinator renamed the
        staging directory): where ranks that run on now (--leave-running) read their images."""
        self.set_committed = True
        assert self.opts.staging is not None
        testhooks.job_point("committed", self.node)
        self._timed("commit")
        self._send("committed", node=self.node, phases=self.phases,
                   manifest_sha256=sha256_of(self.opts.staging / "nodes" / self.node / MANIFEST))
        done = self._await("final", "done")
        self.job_committed = True
        self.moved = Path(done["directory"]) / "nodes" / self.node if "directory" in done else None
        testhooks.job_point("done", self.node)
        return self.moved


class _StagedGate(_Gate):
    """--stage: the node's set is written to node-local storage first (the worker's stage root).
    Before the vote its sealed images are copied to the job's staging directory on the shared
    storage (writebehind.py); once the set committed locally, its logs and manifest, before the
    ack. With --leave-running the ranks ran on at the seal already (run_on_at_seal): their
    downtime excludes the copy, and an abort after that undoes nothing on them (they run on, as
    any abort leaves them); only the copies go."""

    copied: dict[int, dict[str, Any]]

    @property
    def shared(self) -> Path:
        assert self.opts.staging is not None
        return self.opts.staging / "nodes" / self.node

    def prepared(self, manifest: Manifest) -> None:
        testhooks.job_point("write-behind", self.node)
        s = self.set
        self.copied = writebehind.copy_sealed(s.staging.path, self.shared, manifest.files,
                                              [m.pid for m in manifest.members], s.locked_at)
        super().prepared(manifest)

    def _members(self, manifest: Manifest) -> list[dict[str, Any]]:
        out = super()._members(manifest)
        for m in out:  # after the rank's own phases (and its resume, when it ran on at the seal)
            m["phases"].append(self.copied[m["pid"]])
        return out

    def failing(self, error: BaseException) -> None:
        writebehind.remove(self.shared)  # never acked: the coordinator cannot commit it; space back now
        super().failing(error)

    def committed(self, manifest: Manifest) -> Optional[Path]:
        self.set_committed = True  # locally: a failure from here on recovers the ranks from the local copy
        writebehind.copy_tail(self.set.staging.final, self.shared)
        super().committed(manifest)
        self.moved = None  # the local copy: it stays until the worker ends
        return None


def _local_stage(opts: WorkerOptions, node: str) -> Optional[Path]:
    """--stage: this worker's fresh directory in the node-local DIR (refused when DIR is not safe)."""
    return None if opts.stage is None else writebehind.stage_root(opts.stage, opts.job, node)


def checkpoint_worker(opts: WorkerOptions) -> int:
    from ...backends import DataPathChoice
    from ...image.memstage import DEFAULT_DIR as LIVE_STAGING
    from ..checkpoint import CheckpointOptions
    from ..processset import SetCheckpoint
    from ..services import REAL

    assert opts.staging is not None
    node = node_name()
    ch = _connect(opts)
    lock = -1
    local: Optional[Path] = None  # --stage: this worker's node-local directory
    try:
        try:
            lock = _checkpoint_lock(opts.job, node)
            local = _local_stage(opts, node)
        except NpusnapError as e:
            say(f"refused: {e.message}")
            with contextlib.suppress(OSError):
                ch.send("hello", node=node, ranks=[])
            _failed(ch, node, e)
            return e.exit_code
        wait_restored(opts.job, node, opts.lease, say)  # a restore under way: its ranks, all of them
        ranks = find_ranks(opts.job, node, own_step=os.environ.get("SLURM_STEP_ID"))
        say("ranks " + (", ".join(f"{r.pid} (step {r.step} task {r.procid})" for r in ranks) or "none"))
        try:
            ch.send("hello", node=node, ranks=[r.__dict__ for r in ranks])
        except OSError as e:
            say(f"lost the coordinator before the checkpoint ({e.strerror or e}); no rank was touched")
            return JobAborted.exit_code
        if not ranks:
            ch.send("failed", node=node, error=f"no rank of job {opts.job} runs on {node}")
            return JobAborted.exit_code
        try:  # they share the attempt's rendezvous directory, the job's user's
            owners.one_user([r.pid for r in ranks], f"of job {opts.job} on {node}", opts.rendezvous)
        except NpusnapError as e:
            say(f"refused: {e.message}")
            _failed(ch, node, e)
            return e.exit_code
        directory = opts.staging / "nodes" / node if local is None else local / "set"
        # Slurm's tasks are process-group leaders, not session leaders: CRIU needs --shell-job.
        shell_job = opts.shell_job or any(_sid(r.pid) != r.pid for r in ranks)
        copts = CheckpointOptions(directory=directory, leave_running=opts.leave_running, shell_job=shell_job,
                                  live=opts.live_staging is not None, live_staging=opts.live_staging or LIVE_STAGING,
                                  lock_timeout=opts.lock_timeout, criu_timeout=opts.criu_timeout,
                                  data_path=DataPathChoice(opts.data_path),
                                  peers_elsewhere=True, dedup=opts.dedup, compress=opts.compress,
                                  rendezvous=opts.rendezvous,
                                  run_on_at_seal=local is not None and opts.leave_running,
                                  published=None if local is None else opts.staging / "nodes" / node)
        gate = _Gate(ch, opts, node, ranks) if local is None else _StagedGate(ch, opts, node, ranks)
        try:
            testhooks.job_point("lock", node)
            copts.parent = None if opts.parent is None else parent_node(opts.parent, [r.pid for r in ranks])
            gate.run(SetCheckpoint([r.pid for r in ranks], copts, _warnings, REAL, gate=gate))
        except JobAborted as e:
            if gate.set_committed:
                _recover_after_commit(ranks, directory, copts.published)
            say(f"aborted: {e.message}; every rank runs on")
            return e.exit_code
        except NpusnapError as e:
            say(f"failed: {e.one_line()}")
            if gate.job_committed:  # after the job's commit (a rank that failed to run on): it stands
                gate.tell(e)
                _recover_after_commit(ranks, gate.moved or directory, copts.published, remove=False)
            elif gate.set_committed:  # the job cannot commit without this node: undone like an abort
                gate.tell(e)  # first: the other nodes' ranks recover meanwhile, to meet ours
                _recover_after_commit(ranks, directory, copts.published)
            gate.tell(e)
            return e.exit_code
        with contextlib.suppress(OSError):
            ch.send("finished", node=node, downtime={str(p): s for p, s in gate.downtime.items()})
        say("committed" + (", ranks run on" if opts.leave_running else ", ranks stopped"))
        return 0
    finally:
        ch.close()
        if local is not None:  # committed or not, the shared copy is the only one kept
            writebehind.remove(local)
        if lock >= 0:
            os.close(lock)


def parent_node(parent: Path, pids: list[int]) -> Path:
    """--parent: the node checkpoint of the parent job checkpoint that holds exactly these ranks
    (by pid: a restored rank keeps its pid, whichever node it runs on now)."""
    from ...errors import ImageInvalid
    from . import manifest as jm

    pm = jm.load(parent)
    for n in pm.nodes:
        if sorted(r.pid for r in pm.ranks_of(n.name)) == sorted(pids):
            return parent / n.dir
    raise ImageInvalid(f"the parent job checkpoint {parent} has no node holding ranks "
                       f"{', '.join(map(str, sorted(pids)))}: it cannot be their parent",
                       "take a full job checkpoint (no --parent)")


def _sid(pid: int) -> int:
    try:
        return os.getsid(pid)
    except OSError:
        return pid


def _recover_after_commit(ranks: list[Rank], directory: Path, published: Optional[Path],
                          remove: bool = True) -> None:
    """The job was aborted after this node's set committed: every rank back to running, and the
    node's checkpoint removed (the job checkpoint it belonged to was never committed; remove=False:
    it was, and the ranks failed to run on after it). All at once: an HCCL rank's device restore
    waits for its peers' (on this node and the others, in the attempt's rendezvous directory).
    published: where a staged set's parent is named from."""
    from ..recover import recover

    def one(r: Rank) -> None:
        try:
            recover(r.pid, device_images=images / str(r.pid), chain=[p / str(r.pid) for p in chain])
        except NpusnapError as e:
            say(f"rank {r.pid} could not be recovered: {e.one_line()} (run `npusnap recover {r.pid}`)")

    with contextlib.ExitStack() as views:
        images, chain = _committed_images(directory, views, published or directory)
        threads = [threading.Thread(target=one, args=(r,), name=f"recover-{r.pid}") for r in ranks]
        for th in threads:
            th.start()
        for th in threads:
            th.join()  # each bounded by the agent's and HCCL's own deadlines
    if remove:
        shutil.rmtree(directory, ignore_errors=True)


def _committed_images(directory: Path, views: contextlib.ExitStack, named_from: Path) -> tuple[Path, list[Path]]:
    """The committed node checkpoint's device directory and (incremental) its chain's, as the
    daemon reads them: compressed ones (--compress) reassembled from the chunk store. named_from:
    the directory its manifest names its parent relative to (a staged set's shared copy)."""
    from ...errors import ImageInvalid
    from ...image.chain import ancestors, device_views
    from ...image.format import DEVICE_DIR, load_manifest
    from ...image.packed import assembled

    try:
        m = load_manifest(directory)
        return (views.enter_context(assembled(directory, m, DEVICE_DIR)),
                device_views(views, ancestors(named_from, m)) if m.parent is not None else [])
    except (ImageInvalid, StorageProblem) as e:
        say(f"the node's committed checkpoint cannot be read back: {e.one_line()}")
        return directory / DEVICE_DIR, []


# ---------------------------------------------------------------- restore


def restore_worker(opts: WorkerOptions) -> int:
    from ..processes import kill_tree
    from ..processset import restore_set

    assert opts.directory is not None
    node = node_name()
    job = os.environ.get("SLURM_JOB_ID")
    if job:  # from the start: a checkpoint of the job meanwhile waits until the ranks are back (ranks.py)
        register_restored(job, node, [], os.environ.get("SLURM_STEP_ID"), restoring=True)
    ch = _connect(opts)
    try:
        ch.send("hello", node=node, ranks=[])
        try:
            msg = ch.receive(timeout=opts.lease)
        except ProtocolError as e:
            say(f"lost the coordinator before the restore ({e})")
            return JobAborted.exit_code
        if msg["type"] != "restore":
            return JobAborted.exit_code
        node_dir = opts.directory / str(msg["dir"])
        say(f"restoring node {msg['from_node']}'s ranks from {node_dir}")
        try:
            testhooks.job_point("restore", node)
            result = restore_set(_restore_options(opts, node_dir))
        except NpusnapError as e:
            say(f"failed: {e.one_line()}")
            ch.send("failed", node=node, error=e.one_line())
            return e.exit_code
        pids = [m.pid for m in result.members]
        if job:
            by_pid = {int(r["pid"]): r for r in msg.get("ranks", [])}
            register_restored(job, node, [Rank(m.pid, int(by_pid[m.checkpointed]["step"]),
                                               int(by_pid[m.checkpointed]["procid"]))
                                          for m in result.members if m.checkpointed in by_pid],
                              os.environ.get("SLURM_STEP_ID"))
        ch.send("restored", node=node, pids=pids,
                members=[{"pid": m.pid, "phases": [p.__dict__ for p in m.phases]} for m in result.members])
        try:
            go = ch.receive(timeout=opts.lease)["type"] == "go"
        except ProtocolError:
            go = False
        if not go:
            say("the job restore was aborted: killing this node's restored ranks")
            for m in result.manifest.members:
                kill_tree(m.pid, [m.pid, *(p.pid for p in m.processes)])
            for lazy in result.lazy:  # --lazy: their page servers too
                lazy.kill()
            return JobAborted.exit_code
        filled = {"lazy": _finish_lazy(result.lazy)} if result.lazy else {}
        codes = _wait_children(pids)
        if job:
            unregister_restored(job, node)
        with contextlib.suppress(OSError):
            ch.send("exited", node=node, codes=codes, **filled)
        return next((c for c in codes.values() if c != 0), 0)
    finally:
        ch.close()


def _finish_lazy(lazies: list["LazyRestore"]) -> dict[str, Any]:
    """--lazy: waits until every rank's memory is in (or it exited), before any is reaped (the
    page servers are our children too: _wait_children must not take their exit statuses). Each
    rank's outcome on the worker's lines; the node's for the coordinator."""
    seconds, problems = 0.0, []
    for lazy in lazies:
        try:
            out = lazy.finish()
        except NpusnapError as e:  # its page server failed: the rank was killed
            say(e.one_line())
            problems.append(e.message)
            continue
        seconds = max(seconds, out.seconds)
        problems += out.problems
        for p in out.problems:
            say(p)
        say(f"rank {lazy.root}: " + ("exited before all its memory was in" if out.workload_exited
                                     else f"all memory in, {out.seconds:.2f} s after its restore"))
    return {"seconds": round(seconds, 6), "problems": problems}


def _restore_options(opts: WorkerOptions, node_dir: Path) -> "RestoreOptions":
    """This node's set restored with the job's rendezvous directory (communicators re-form across
    nodes there) and this node's npusim daemon (a rank from another node must not reconnect to
    the daemon of the node it was checkpointed on)."""
    from ...platform.simdaemon import socket_path
    from ..restore import RestoreOptions

    return RestoreOptions(directory=node_dir, rendezvous=opts.rendezvous, daemon_socket=socket_path(),
                          lazy=opts.lazy)


def _wait_children(pids: list[int]) -> dict[str, int]:
    """Reap until every restored root has exited (we are their parent; orphans of theirs are
    reaped too, as their subreaper); their exit codes by pid."""
    codes: dict[str, int] = {}
    left = set(pids)
    while left:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid in left:
            left.discard(pid)
            codes[str(pid)] = os.waitstatus_to_exitcode(status)
    for pid in left:
        codes[str(pid)] = 255  # not our child any more: its exit code is not known
    return codes
