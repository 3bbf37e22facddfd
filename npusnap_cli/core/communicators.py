"""HCCL communicators across a checkpoint: which ranks a set must hold, and where restored ranks meet.

A rank's lock waits for every rank of its communicators to be locking (the free pass, see
native/npusim/hccl_snapshot.cpp), so a checkpoint is consistent only when every rank of each
communicator is in the same set: `admit` refuses a set that leaves ranks out (PeersOutsideSet,
exit 11) unless forced, and then tells the members' runtimes to lock alone. After CRIU restored a
set, its ranks re-form their communicators through one rendezvous directory (`rendezvous`), private
to the restore, that every member's runtime is handed before its device restore: rank 0 publishes
its new root there and the others wait for it. A job coordinator hands the same kind of directory
(on storage every node sees) to the ranks of all nodes. A set checkpoint makes one too, before
the lock, for the restores it does in place (rollback, --leave-running, lease expiry, guardian):
core/processset.py.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from ..errors import PeersOutsideSet
from .progress import Progress, warn


@dataclass(frozen=True)
class Communicator:
    """A collective communicator one process belongs to: its id, and its rank of how many."""

    id: str
    rank: int
    ranks: int


def held_by(backend: Any) -> list[Communicator]:
    """The communicators a member's process holds (none for a backend without HCCL)."""
    listing = getattr(backend, "communicators", None)
    if listing is None:
        return []
    return [Communicator(str(c["id"]), int(c["rank"]), int(c["ranks"])) for c in listing()]


def missing_ranks(members: Mapping[int, list[Communicator]]) -> dict[str, tuple[Communicator, list[int]]]:
    """Per communicator id: one member's view of it and the ranks no member of the set holds."""
    held: dict[str, set[int]] = {}
    some: dict[str, Communicator] = {}
    for comms in members.values():
        for c in comms:
            held.setdefault(c.id, set()).add(c.rank)
            some.setdefault(c.id, c)
    out = {}
    for cid, ranks in held.items():
        absent = [r for r in range(some[cid].ranks) if r not in ranks]
        if absent:
            out[cid] = (some[cid], absent)
    return out


def admit(backends: Mapping[int, Any], force: bool, progress: Progress) -> None:
    """Refuse a set whose members' communicators have ranks outside it, before anything is locked;
    with force, warn and have those members lock without waiting for the absent ranks."""
    members = {pid: held_by(b) for pid, b in backends.items()}
    gaps = missing_ranks(members)
    if not gaps:
        return
    cid, (comm, absent) = next(iter(gaps.items()))
    owner = next(pid for pid, comms in members.items() if any(c.id == cid for c in comms))
    listed = ", ".join(str(r) for r in absent)
    if not force:
        raise PeersOutsideSet(f"process {owner} holds HCCL communicator {cid} (rank {comm.rank} of {comm.ranks}) "
                              f"whose rank(s) {listed} are not being checkpointed with it")
    warn(progress, f"--force: HCCL communicator {cid} is checkpointed without rank(s) {listed}; "
                   "those ranks will hang or fail in their next collective, and this checkpoint cannot "
                   "re-form the communicator without them")
    for pid, comms in members.items():
        if any(c.id in gaps for c in comms):
            backends[pid].hccl_option("alone", "1")


@contextlib.contextmanager
def rendezvous(needed: bool, owner: Optional[int] = None) -> Iterator[Optional[Path]]:
    """A private directory for one restore's (or one set checkpoint's) ranks to meet in (None when
    no member holds a communicator of more than one rank); removed afterwards. owner: the restored processes' uid,
    which must be able to write there when we run as root."""
    if not needed:
        yield None
        return
    import shutil  # here: few restores need it, and with tempfile it is ~3 ms of imports before CRIU's request
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="npusnap-hccl-"))  # 0700, a random name: nobody can plant a root
    try:
        if owner is not None and os.geteuid() == 0 and owner != 0:
            os.chown(d, owner, -1)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def hand(backend: Any, directory: Optional[Path]) -> None:
    """Give a member's runtime the set's rendezvous point before its device restore."""
    if directory is not None and hasattr(backend, "hccl_option"):
        backend.hccl_option("rendezvous", str(directory))
