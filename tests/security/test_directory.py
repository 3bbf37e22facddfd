"""Planted paths in a checkpoint directory: links and unlisted files anywhere (logs/
included) are refused by verify and restore, restore never writes a log through a link,
and --pidfile in a world-writable directory never writes through a planted temp name.
The attacker is a real second user who can write where the attack needs it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.faults.support import assert_failed_cleanly
from tests.helpers import Workload, criu_works, kill_and_wait, npusnap, rewind_to_checkpoint
from tests.users import as_user, other_user, traversable

pytestmark = pytest.mark.criu

_OUT: list[Path] = []  # the workload's stdout file, rewound before each restore (CRIU checks its size)
LOOP = "import time\ni = 0\nwhile True:\n    print(i, flush=True); i += 1; time.sleep(0.05)\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not criu_works():
        pytest.skip("CRIU does not work here")
    base = tmp_path_factory.mktemp("dirsec")
    w = Workload([sys.executable, "-u", "-c", LOOP], base / "w.out")
    try:
        w.wait_for_line(3)
        r = npusnap("checkpoint", w.pid, "-D", base / "ck", "--device", "none", timeout=120)
        assert r.returncode == 0, r.stderr
        w.proc.wait(timeout=10)
    finally:
        w.stop()
    _OUT[:] = [base / "w.out"]
    yield base / "ck"


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(checkpoint, ck, symlinks=True)
    return ck


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("precious\n")
    os.chmod(v, 0o600)  # root's file: the attacker cannot write it
    return v



def _give_logs_to(ck: Path, uid: int) -> None:
    """The attacker owns logs/ (a checkpoint of theirs, or shared storage they can write)."""
    traversable(ck)
    os.chown(ck / "logs", uid, -1)


def _write(path: str) -> None:
    Path(path).write_text("x")


def _plant_link(link: str, target: str) -> None:
    os.symlink(target, link)


def _restore_and_kill(ck: Path, *args: object) -> tuple[int, str, int]:
    rewind_to_checkpoint(ck, _OUT[0])
    r = npusnap("restore", ck, *args, "--detach", timeout=120)
    pid = 0
    if r.returncode == 0:
        pid = int(r.stderr.split("restored process ")[1].split()[0])
        kill_and_wait(pid)
    return r.returncode, r.stderr, pid


def test_link_at_restore_log_is_refused_and_never_written(checkpoint, tmp_path):
    ck = _copy(checkpoint, tmp_path)
    victim = _victim(tmp_path)
    mallory = other_user()
    _give_logs_to(ck, mallory.uid)
    as_user(mallory, _plant_link, str(ck / "logs" / "restore.log"), str(victim))
    for argv in (("verify", ck), ("restore", ck, "--detach")):
        assert_failed_cleanly(npusnap(*argv, timeout=60), {8})
    assert victim.read_text() == "precious\n"
    # Even unverified, the CRIU log goes into a fresh directory, never through the link.
    code, err, _ = _restore_and_kill(ck, "--no-verify")
    assert code == 0, err
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("where", ["logs/notes.txt", "extra", "criu/../logs/restore-abcdefgh/evil"])
def test_unlisted_files_are_refused(checkpoint, tmp_path, where):
    ck = _copy(checkpoint, tmp_path)
    mallory = other_user()
    _give_logs_to(ck, mallory.uid)
    os.chmod(ck, 0o777)  # the attacker may add files anywhere
    path = os.path.normpath(ck / where)
    if "restore-" in where:
        as_user(mallory, os.makedirs, os.path.dirname(path))
    as_user(mallory, _write, path)
    assert_failed_cleanly(npusnap("verify", ck, timeout=60), {8})
    assert_failed_cleanly(npusnap("restore", ck, "--detach", timeout=60), {8})


def test_a_restore_keeps_the_directory_valid(checkpoint, tmp_path):
    ck = _copy(checkpoint, tmp_path)
    code, err, _ = _restore_and_kill(ck)
    assert code == 0, err
    logs = list((ck / "logs").glob("restore-*/restore.log"))
    assert logs and not (ck / "logs" / "restore.log").exists()
    r = npusnap("verify", ck, timeout=60)
    assert r.returncode == 0, r.stderr


def test_pidfile_never_written_through_a_planted_temp_name(checkpoint, tmp_path):
    ck = _copy(checkpoint, tmp_path)
    victim = _victim(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # world-writable, sticky, like /tmp
    traversable(shared)
    pidfile = shared / "job.pid"
    as_user(other_user(), _plant_link, str(shared / "job.pid.tmp"), str(victim))
    code, err, pid = _restore_and_kill(ck, "--pidfile", pidfile)
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert pidfile.read_text().strip() == str(pid)
    assert not pidfile.is_symlink()
