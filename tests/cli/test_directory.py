"""-D and --replace touch only what npusnap wrote: a new directory, an empty one, or
(with --replace) a checkpoint whose manifest it can read. Anything else (a device node,
a file, a symlink, a stranger's directory) is refused before the workload is locked,
and checked again, atomically, at commit. Any byte in -D works end to end."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Callable

import pytest

from npusnap_cli.errors import StorageProblem
from npusnap_cli.image.format import DeviceState, Manifest
from npusnap_cli.image.staging import Staging
from tests.helpers import Workload, npusnap, proc_state, requires_criu


def _checkpoint(final: Path, pid: int = 4242, replace: bool = False) -> Path:
    s = Staging(final, replace=replace)
    (s.criu_dir / "core.img").write_bytes(b"c" * 64)
    m = Manifest(pid=pid, created="2024-01-01T12:00:00.000001+00:00", host="h", kernel="k",
                 npusnap_version="0", criu_version="4.2.1", device=DeviceState(), files=s.seal())
    return s.commit(m)


def _devnode(p: Path) -> None:
    os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null


def _file(p: Path) -> None:
    p.write_text("the user's data\n")


def _link(p: Path) -> None:
    (p.parent / "real").mkdir()
    p.symlink_to(p.parent / "real")


def _dangling(p: Path) -> None:
    p.symlink_to(p.parent / "nowhere")


def _stranger(p: Path) -> None:
    p.mkdir()
    (p / "data.bin").write_bytes(b"keep me")


def _bad_manifest(p: Path) -> None:
    p.mkdir()
    (p / "manifest.yaml").write_text("pid: 1\n")  # no checksum line: not one npusnap wrote


def _fifo(p: Path) -> None:
    os.mkfifo(p)


KINDS: dict[str, Callable[[Path], None]] = {
    "device node": _devnode, "regular file": _file, "symlink": _link, "dangling symlink": _dangling,
    "stranger's directory": _stranger, "foreign manifest": _bad_manifest, "fifo": _fifo,
}


def _snapshot(p: Path) -> tuple[int, int, int, bytes]:
    st = os.lstat(p)
    body = p.read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(p).encode() if stat.S_ISLNK(st.st_mode) else b""
    return st.st_ino, st.st_mode, st.st_rdev, body


def _siblings(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_staging_refuses_what_npusnap_did_not_write(tmp_path: Path, kind: str, replace: bool) -> None:
    target = tmp_path / "ck"
    KINDS[kind](target)
    before = _snapshot(target)
    with pytest.raises(StorageProblem) as e:
        Staging(target, replace=replace)
    assert "\n" not in e.value.one_line()
    assert _snapshot(target) == before
    assert _siblings(tmp_path) == []  # nothing staged, nothing renamed


def test_replace_accepts_a_checkpoint_and_an_empty_directory(tmp_path: Path) -> None:
    first = _checkpoint(tmp_path / "ck", pid=1)
    _checkpoint(first, pid=2, replace=True)
    assert "pid: 2" in (first / "manifest.yaml").read_text()
    (tmp_path / "empty").mkdir()
    _checkpoint(tmp_path / "empty")
    assert (tmp_path / "empty" / "manifest.yaml").is_file()
    assert _siblings(tmp_path) == []


@pytest.mark.parametrize("kind", ["regular file", "symlink", "stranger's directory"])
def test_commit_refuses_what_appeared_meanwhile(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "ck"
    s = Staging(target)                     # absent now
    (s.criu_dir / "core.img").write_bytes(b"c")
    KINDS[kind](target)                     # created while the checkpoint was written
    before = _snapshot(target)
    m = Manifest(pid=1, created="x", host="h", kernel="k", npusnap_version="0", criu_version="4",
                 files=s.seal())
    with pytest.raises(StorageProblem, match="changed while the checkpoint was written"):
        s.commit(m)
    s.discard()
    assert _snapshot(target) == before
    assert _siblings(tmp_path) == []


def test_commit_refuses_an_empty_directory_that_filled_up(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    target.mkdir()
    s = Staging(target)
    (target / "late.txt").write_text("arrived during the dump")
    m = Manifest(pid=1, created="x", host="h", kernel="k", npusnap_version="0", criu_version="4",
                 files=s.seal())
    with pytest.raises(StorageProblem):
        s.commit(m)
    s.discard()
    assert (target / "late.txt").read_text() == "arrived during the dump"
    assert _siblings(tmp_path) == []


def test_replace_commit_refuses_a_checkpoint_swapped_in_meanwhile(tmp_path: Path) -> None:
    target = _checkpoint(tmp_path / "ck", pid=1)
    s = Staging(target, replace=True)
    os.rename(target, tmp_path / "moved")
    other = _checkpoint(tmp_path / "ck", pid=3)  # same name, another directory
    m = Manifest(pid=2, created="x", host="h", kernel="k", npusnap_version="0", criu_version="4",
                 files=s.seal())
    with pytest.raises(StorageProblem, match="changed while"):
        s.commit(m)
    s.discard()
    assert "pid: 3" in (other / "manifest.yaml").read_text()
    assert _siblings(tmp_path) == []


@pytest.fixture
def sleeper(tmp_path: Path):  # type: ignore[no-untyped-def]
    w = Workload(["sleep", "1000"], tmp_path / "sleep.out")
    try:
        yield w
    finally:
        w.stop()


@requires_criu
@pytest.mark.parametrize("kind", ["device node", "regular file", "symlink", "dangling symlink",
                                  "stranger's directory"])
def test_checkpoint_refuses_before_touching_the_workload(tmp_path: Path, sleeper: Workload, kind: str) -> None:
    target = tmp_path / "d" / "ck"
    target.parent.mkdir()
    KINDS[kind](target)
    before = _snapshot(target)
    for extra in ([], ["--replace"]):
        r = npusnap("checkpoint", sleeper.pid, "-D", target, "--leave-running", *extra)
        assert r.returncode == StorageProblem.exit_code, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert _snapshot(target) == before
        assert _siblings(target.parent) == []
        assert proc_state(sleeper.pid) in ("S", "R")  # running, never stopped


@requires_criu
def test_any_byte_in_the_directory_works_end_to_end(tmp_path: Path, sleeper: Workload) -> None:
    name = os.fsdecode(b"ck\nwith\ttab \xff\x1b[2J")
    target = tmp_path / name
    r = npusnap("checkpoint", sleeper.pid, "-D", target)
    assert r.returncode == 0, r.stderr
    sleeper.proc.wait(timeout=10)
    lines = r.stderr.strip().splitlines()
    assert lines and all("checkpoint" in line or "restore" in line for line in lines)  # no line broken
    assert "\x1b[2J" not in r.stderr and "\\x1b[2J" in r.stderr and "\\xff" in r.stderr

    human = npusnap("list", tmp_path)
    assert human.returncode == 0 and "\\nwith\\ttab" in human.stdout and "\x1b" not in human.stdout
    doc = json.loads(npusnap("list", tmp_path, "--json", check=True).stdout)
    [entry] = [c for c in doc["checkpoints"] if c["name"] == name]
    assert entry["state"] == "valid" and entry["path"] == str(target)
    assert npusnap("verify", target).returncode == 0

    rs = npusnap("restore", target, "--detach", "--json")
    assert rs.returncode == 0, rs.stderr
    sleeper.extra_pids.append(json.loads(rs.stdout)["pid"])
    assert proc_state(sleeper.pid) in ("S", "R")
