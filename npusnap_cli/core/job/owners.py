"""Whose the ranks' rendezvous directories are. The ranks write there (rank 0 publishes its new
root, the others read it; npusim trusts a directory of root's or of the rank's own user, and
never one that others may write), so a coordinator run as root for another user's job creates
them as root, then hands them to the ranks' user by file descriptor: never by name, which that
user could have swapped for a link or a directory of theirs meanwhile (refused). Still 0700."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterable, Optional

from ...errors import PermissionProblem, StorageProblem, UnsupportedTarget

Owner = tuple[int, int]  # uid, gid


def hand_over(owner: Optional[Owner]) -> Optional[Owner]:
    """The owner to give our directories to: None when they are ours already, or we cannot."""
    if owner is None or os.geteuid() != 0 or owner[0] == os.geteuid():
        return None
    return owner


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def make_dir(parent: Path, name: str, owner: Optional[Owner], parent_follows: bool = True,
             parent_mode: Optional[int] = None) -> Path:
    """parent/name, created by us (0700, never replacing anything) and then owned by owner.
    parent_follows=False: parent itself must not be a link (a directory of ours: a job checkpoint's),
    and parent_mode, if given, is set on it (by its fd too)."""
    try:
        pfd = os.open(parent, _DIR | (0 if parent_follows else os.O_NOFOLLOW))
    except OSError as e:
        why = "not a directory (a link?)" if e.errno in (errno.ENOTDIR, errno.ELOOP) else e.strerror
        raise StorageProblem(f"cannot open {parent}: {why}") from e
    try:
        if parent_mode is not None:
            _ours(pfd, parent)
            os.fchmod(pfd, parent_mode)
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
        except OSError as e:
            raise StorageProblem(f"cannot create {parent / name}: {e.strerror}") from e
        give(pfd, parent / name, owner)
    finally:
        os.close(pfd)
    return parent / name


def give(pfd: int, path: Path, owner: Optional[Owner]) -> None:
    """The directory we just created as path.name in pfd, given to owner through its own fd; refused
    when it is no longer the one we created (a link, or a directory of somebody else's)."""
    try:
        fd = os.open(path.name, _DIR | os.O_NOFOLLOW, dir_fd=pfd)
    except OSError as e:
        raise PermissionProblem(f"{path} was replaced while it was created ({e.strerror}): refused",
                                "somebody else writes in its parent directory") from e
    try:
        _ours(fd, path)
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _ours(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionProblem(f"{path} was replaced while it was created (now uid {st.st_uid}'s, "
                                f"mode {stat.S_IMODE(st.st_mode):o}): refused",
                                "somebody else writes in its parent directory")


def uid_of(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None  # gone: its lock fails by itself


def one_user(pids: Iterable[int], where: str, meet: Optional[Path]) -> None:
    """Refused unless every rank runs as one user, the owner of the rendezvous directory meet
    (the job's user, as the coordinator made it): they share it."""
    users: dict[int, list[int]] = {}
    for pid in pids:
        uid = uid_of(pid)
        if uid is not None:
            users.setdefault(uid, []).append(pid)
    hint = "the ranks of one job checkpoint must all run as the job's user (they share its rendezvous directories)"
    if len(users) > 1:
        listed = "; ".join(f"uid {u}: {' '.join(map(str, p))}" for u, p in sorted(users.items()))
        raise UnsupportedTarget(f"the ranks {where} belong to several users ({listed})", hint)
    if meet is None or not users:
        return
    try:
        owner = os.lstat(meet).st_uid
    except OSError as e:
        raise StorageProblem(f"cannot find the ranks' rendezvous directory {meet}: {e.strerror}") from e
    uid, pids_of = next(iter(users.items()))
    if uid != owner:
        raise UnsupportedTarget(f"the ranks {where} ({' '.join(map(str, pids_of))}) run as uid {uid}, not as the "
                                f"job's user (uid {owner}, the owner of {meet})", hint)
