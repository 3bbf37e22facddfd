"""core/job/writebehind.py: the node-local --stage directory checked and created safely, and the
sealed images copied to the shared storage against their seal's checksums."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from npusnap_cli.core.job import writebehind
from npusnap_cli.errors import ImageInvalid, PermissionProblem, StorageProblem
from npusnap_cli.image.format import FileEntry, checksum_file


def test_a_fresh_private_directory_each_time(tmp_path: Path) -> None:
    a, b = writebehind.stage_root(tmp_path, "7", "node1"), writebehind.stage_root(tmp_path, "7", "node1")
    assert a != b and a.parent == b.parent == tmp_path and a.name.startswith("npusnap-job-7-node1-")
    assert stat.S_IMODE(os.lstat(a).st_mode) == 0o700 and os.lstat(a).st_uid == os.geteuid()


def test_a_sticky_world_writable_directory_is_fine(tmp_path: Path) -> None:
    tmp_path.chmod(0o1777)
    assert writebehind.stage_root(tmp_path, "7", "n").is_dir()


def test_unsafe_directories_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(PermissionProblem, match="is a symbolic link"):
        writebehind.stage_root(tmp_path / "link", "7", "n")
    real.chmod(0o777)
    with pytest.raises(PermissionProblem, match="writable by everybody and not sticky"):
        writebehind.stage_root(real, "7", "n")
    with pytest.raises(StorageProblem, match="No such file"):
        writebehind.stage_root(tmp_path / "missing", "7", "n")
    assert list(real.iterdir()) == []


def _sealed(src: Path) -> list[FileEntry]:
    files = {"criu/11/pages-1.img": os.urandom(3 << 20), "criu/11/core-11.img": b"core",
             "device/12/memory.bin": os.urandom(1 << 20)}
    entries = []
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
        entries.append(FileEntry(rel, *checksum_file(src / rel)))
    return entries


def test_each_members_files_are_copied_and_checked(tmp_path: Path) -> None:
    src, dst = tmp_path / "local", tmp_path / "shared"
    files = _sealed(src)
    phases = writebehind.copy_sealed(src, dst, files, [11, 12], time.monotonic())
    assert set(phases) == {11, 12} and phases[11]["bytes"] == (3 << 20) + 4 and phases[12]["bytes"] == 1 << 20
    assert all(p["name"] == "write-behind" and p["start"] >= 0 for p in phases.values())
    for f in files:
        assert (dst / f.path).read_bytes() == (src / f.path).read_bytes()
        assert stat.S_IMODE(os.lstat(dst / f.path).st_mode) == 0o600


def test_a_file_that_changed_since_the_seal_is_refused(tmp_path: Path) -> None:
    src, dst = tmp_path / "local", tmp_path / "shared"
    files = _sealed(src)
    (src / files[1].path).write_bytes(b"CORE")  # same size, other bytes
    with pytest.raises(ImageInvalid, match="is not what the seal checksummed"):
        writebehind.copy_sealed(src, dst, files, [11, 12], time.monotonic())


def test_nothing_is_written_over(tmp_path: Path) -> None:
    src, dst = tmp_path / "local", tmp_path / "shared"
    files = _sealed(src)
    (dst / "device" / "12").mkdir(parents=True)
    (dst / "device" / "12" / "memory.bin").write_bytes(b"planted")
    with pytest.raises(StorageProblem, match="write-behind of device/12/memory.bin"):
        writebehind.copy_sealed(src, dst, files, [11, 12], time.monotonic())
    assert (dst / "device" / "12" / "memory.bin").read_bytes() == b"planted"
