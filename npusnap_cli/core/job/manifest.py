"""The job checkpoint directory and its manifest.

    DIR/job.json            the job manifest, written last: ranks, nodes, hosts, devices, each
                            node's directory with the sha256 of that node's own manifest
    DIR/nodes/NODE/         one process-set checkpoint per node (core/processset.py): its own
                            manifest.yaml with every file's checksum, criu/PID/ and device/PID/
                            per rank (the rank's image directory)
    DIR/rendezvous/         where restored ranks re-form their communicators: one fresh RUN/ per restore

The directory is built under a hidden sibling name (.NAME.partial-XXXXXXXX, which `prune` knows)
and renamed into place by the coordinator once every worker committed: DIR exists only whole."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ...errors import ImageInvalid, StorageProblem

JOB_MANIFEST = "job.json"
NODES_DIR = "nodes"
RENDEZVOUS_DIR = "rendezvous"
SECRET = "secret"  # in the staging directory only; removed before the commit
JOB_FORMAT_VERSION = 1


@dataclass
class RankEntry:
    rank: int  # the job-wide rank: the order of (step, procid) over the whole job
    step: int
    procid: int
    node: str
    pid: int
    images: str  # the rank's CRIU images, relative to DIR
    device: dict[str, Any] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)  # this rank's lock, backup, dump
    # seconds from its lock until it ran again, unlocked (--leave-running); None: stopped
    downtime: Optional[float] = None


@dataclass
class NodeEntry:
    name: str
    address: str
    dir: str  # relative to DIR
    manifest_sha256: str
    phases: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class JobManifest:
    slurm_job_id: str
    created: str
    npusnap_version: str
    nodes: list[NodeEntry]
    ranks: list[RankEntry]
    rendezvous: str = RENDEZVOUS_DIR
    phases: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = JOB_FORMAT_VERSION
    parent: Optional[str] = None  # --parent: the parent job checkpoint, relative to DIR (each node names its own)

    def node(self, name: str) -> NodeEntry:
        return next(n for n in self.nodes if n.name == name)

    def ranks_of(self, node: str) -> list[RankEntry]:
        return [r for r in self.ranks if r.node == node]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_job_checkpoint(root: Path) -> bool:
    return (root / JOB_MANIFEST).is_file()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write(root: Path, m: JobManifest) -> None:
    tmp = root / (JOB_MANIFEST + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(m.to_dict(), f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.rename(tmp, root / JOB_MANIFEST)
    except OSError as e:
        raise StorageProblem(f"cannot write the job manifest in {root}: {e.strerror}") from e


def load(root: Path) -> JobManifest:
    path = root / JOB_MANIFEST
    if not path.is_file():
        raise ImageInvalid(f"{root} is not a job checkpoint (no {JOB_MANIFEST})",
                           "a job checkpoint is a directory `npusnap job checkpoint` committed")
    try:
        d = json.loads(path.read_text())
        if d.get("format_version") != JOB_FORMAT_VERSION:
            raise ImageInvalid(f"{path}: job format version {d.get('format_version')} is not "
                               f"{JOB_FORMAT_VERSION}", "use the npusnap that wrote it")
        d["nodes"] = [NodeEntry(**n) for n in d["nodes"]]
        d["ranks"] = [RankEntry(**r) for r in d["ranks"]]
        return JobManifest(**d)
    except (ValueError, TypeError, KeyError) as e:
        raise ImageInvalid(f"{path} is not a valid job manifest ({e})") from e


def verify(root: Path, deep: bool = True) -> JobManifest:
    """The job manifest, every node's manifest against its recorded sha256, and (deep) every
    node's files against their checksums. ImageInvalid names the first thing that is wrong."""
    from ...image.format import MANIFEST
    from ...image.packed import verify as verify_node

    m = load(root)
    for n in m.nodes:
        d = root / n.dir
        if Path(n.dir).is_absolute() or ".." in Path(n.dir).parts or not (d / MANIFEST).is_file():
            raise ImageInvalid(f"{root}: node {n.name}'s checkpoint {n.dir} is missing")
        if sha256_of(d / MANIFEST) != n.manifest_sha256:
            raise ImageInvalid(f"{root}: node {n.name}'s manifest does not match the job manifest's checksum",
                               "the node's checkpoint was changed after the commit; do not restore it")
        if deep:
            try:
                verify_node(d)
                verify_node_chain(d)
            except ImageInvalid as e:
                raise ImageInvalid(f"node {n.name}: {e.message}", e.hint) from e
    return m


def verify_node_chain(node_dir: Path) -> list[Path]:
    """An incremental job checkpoint's node: every link of its chain (the parent job checkpoints'
    nodes holding the same ranks), every file checked."""
    from ...image.chain import verify_chain
    from ...image.format import load_manifest

    return [p for p, _ in verify_chain(node_dir, load_manifest(node_dir), deep=True)]
