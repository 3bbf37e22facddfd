"""The ranks' rendezvous directories of a job checkpoint or restore run by root for another
user's job (core/job/owners.py): created by root, handed to the ranks' user by file descriptor
(0700), so that the ranks can publish and read their communicators' roots there; a link or a
directory that user planted in its place is refused and root's handover never lands on it; ranks
of several users are refused. Real second users (tests/users.py), real processes."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Iterator

import pytest

from npusnap_cli.core.job import owners
from npusnap_cli.core.job.coordinator import _attempt_rendezvous, _ranks_can_reach, _rendezvous
from npusnap_cli.errors import PermissionProblem, StorageProblem, UnsupportedTarget
from tests.users import User, as_user, device_user, other_user, popen_as


def _owner(u: User) -> owners.Owner:
    return u.uid, u.gid


@pytest.fixture
def users_dir(scratch: Path) -> Path:
    """A shared directory of the ranks' user (alice), where root writes the job checkpoint."""
    alice = device_user()
    d = scratch / "alice"
    d.mkdir(mode=0o755)
    os.chown(d, alice.uid, alice.gid)
    return d


def _write_root(meet: str) -> str:
    """As the ranks' user: what rank 0 does at a re-form (publish its root), read back."""
    p = Path(meet) / "hccl-1.root"
    p.write_text("root")
    return p.read_text()


def test_the_attempts_and_the_restores_rendezvous_are_the_ranks_users(users_dir: Path) -> None:
    alice = device_user()
    meet = _attempt_rendezvous(users_dir / "ck", _owner(alice))
    st = meet.lstat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (alice.uid, alice.gid, 0o700)
    assert as_user(alice, _write_root, str(meet)) == "root"
    staging = users_dir / ".ck.partial-x"  # the job checkpoint DIR as root makes it (0700)
    staging.mkdir(0o700)
    _ranks_can_reach(staging, _owner(alice))
    assert stat.S_IMODE(staging.stat().st_mode) == 0o711 and staging.stat().st_uid == 0  # passable, root's
    run = _rendezvous(staging / "rendezvous", "run1", _owner(alice))
    assert (run.lstat().st_uid, stat.S_IMODE(run.lstat().st_mode)) == (alice.uid, 0o700)
    assert as_user(alice, _write_root, str(run)) == "root"
    assert as_user(other_user(), _listable, str(run)) is False  # nobody else's


def _listable(path: str) -> bool:
    try:
        os.listdir(path)
        return True
    except PermissionError:
        return False


def test_ours_stay_ours_when_the_job_is_our_own(tmp_path: Path) -> None:
    assert owners.hand_over((os.geteuid(), os.getegid())) is None
    meet = _attempt_rendezvous(tmp_path / "ck", owners.hand_over((os.geteuid(), os.getegid())))
    assert meet.lstat().st_uid == os.geteuid()


def _plant(parent: str, name: str, kind: str, target: str) -> str:
    """As the other user: put a link (to target) or a directory of theirs at parent/name."""
    p = Path(parent) / name
    if p.exists() or p.is_symlink():
        os.rename(p, Path(parent) / (name + ".moved"))  # root's own one, moved aside
    if kind == "link":
        p.symlink_to(target)
    else:
        p.mkdir(mode=0o700)
    return kind


@pytest.mark.parametrize("kind", ["link", "dir"])
def test_a_planted_link_or_directory_is_refused(users_dir: Path, scratch: Path, kind: str) -> None:
    alice = device_user()
    victim = scratch / "victim"  # root's: a handover that followed a link would give it away
    victim.mkdir(mode=0o700)
    # Planted before root creates it: mkdir never replaces anything.
    as_user(alice, _plant, str(users_dir), "early", kind, str(victim))
    with pytest.raises(StorageProblem, match="cannot create .*early: File exists"):
        owners.make_dir(users_dir, "early", _owner(alice))
    # Swapped after root created it, before the handover (the race make_dir's fd closes).
    os.mkdir(users_dir / "late", 0o700)
    as_user(alice, _plant, str(users_dir), "late", kind, str(victim))
    pfd = os.open(users_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(PermissionProblem, match="was replaced while it was created"):
            owners.give(pfd, users_dir / "late", _owner(alice))
    finally:
        os.close(pfd)
    assert victim.stat().st_uid == 0 and stat.S_IMODE(victim.stat().st_mode) == 0o700
    # A job checkpoint's rendezvous/ turned into a link: refused, nothing created through it.
    staging = scratch / "staging"
    staging.mkdir(0o700)
    (staging / "rendezvous").symlink_to(victim)
    with pytest.raises(StorageProblem, match="cannot open"):
        _rendezvous(staging / "rendezvous", "run1", _owner(alice))
    assert list(victim.iterdir()) == []


@pytest.fixture
def two_users_processes() -> Iterator[list[int]]:
    """A sleeping process of alice's and one of mallory's (the ranks of a job of several users)."""
    procs = [popen_as(u, ["sleep", "60"]) for u in (device_user(), other_user())]
    try:
        for p in procs:  # setpriv changes user, then execs sleep: only then is the uid the user's
            deadline = time.monotonic() + 30
            while Path(f"/proc/{p.pid}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
                time.sleep(0.01)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_ranks_of_several_users_are_refused(two_users_processes: list[int], users_dir: Path) -> None:
    alice, mallory = device_user(), other_user()
    with pytest.raises(UnsupportedTarget, match="belong to several users") as refused:
        owners.one_user(two_users_processes, "of job 7 on node1", None)
    for user, pid in zip((alice, mallory), two_users_processes):  # listed by uid, whichever is lower
        assert f"uid {user.uid}: {pid}" in str(refused.value)
    meet = _attempt_rendezvous(users_dir / "ck", _owner(alice))
    owners.one_user(two_users_processes[:1], "of job 7 on node1", meet)  # alice's ranks, alice's meet
    with pytest.raises(UnsupportedTarget, match=rf"run as uid {mallory.uid}, not as the job's user \(uid {alice.uid}"):
        owners.one_user(two_users_processes[1:], "of job 7 on node2", meet)
