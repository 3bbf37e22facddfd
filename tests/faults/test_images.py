"""Damaged and hostile checkpoint images: every file of a real device checkpoint with a
flipped byte, truncated, or deleted; an edited manifest; a future format version;
manifest paths escaping the directory. `verify` and `restore` must refuse (exit 8),
start nothing, and never read or write outside the directory. A FIFO outside the
directory is the bait: opening it for reading would hang the command (caught by its
timeout)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from npusnap_cli.errors import ImageInvalid
from npusnap_cli.image.format import verify
from tests.conftest import NpuSimDaemon
from tests.helpers import npusnap

from .support import assert_failed_cleanly, proc_state, start_train, wait_progress


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real device checkpoint of examples/train.py (its process killed, its pid free)."""
    base = tmp_path_factory.mktemp("images")
    d = tempfile.mkdtemp(prefix="npi-")
    daemon = NpuSimDaemon(socket=os.path.join(d, "d.sock"))
    daemon.start()
    w = None
    try:
        env = {**os.environ, "NPUSIM_SOCKET": daemon.socket}
        w = start_train(base, env)
        wait_progress(w, 2)
        ck = base / "pristine"
        r = npusnap("checkpoint", w.pid, "-D", ck, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        w.proc.wait(timeout=10)
        yield ck
    finally:
        if w is not None:
            w.stop()
        daemon.stop()
        shutil.rmtree(d, ignore_errors=True)


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck, symlinks=True)
    return ck


def manifest(ck: Path) -> dict:
    return yaml.safe_load((ck / "manifest.yaml").read_text())


def write_manifest(ck: Path, m: dict) -> None:
    """Write an edited manifest resealed with a valid checksum: what is tested is what follows."""
    from npusnap_cli.image.format import manifest_text

    m = {k: v for k, v in m.items() if k != "manifest_checksum"}
    (ck / "manifest.yaml").write_text(manifest_text(m))


def outside_snapshot(tmp_path: Path) -> dict[str, tuple]:
    out = {}
    for p in tmp_path.rglob("*"):
        if p.relative_to(tmp_path).parts[0] in ("ck", "saved"):
            continue
        st = os.lstat(p)
        out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def assert_refused_everywhere(ck: Path, tmp_path: Path, pid: int, what: str) -> None:
    """verify and restore both refuse with exit 8, quickly, start nothing, touch nothing outside."""
    before = outside_snapshot(tmp_path)
    for args in (("verify", ck), ("restore", ck, "--detach")):
        r = npusnap(*args, timeout=30)
        line = assert_failed_cleanly(r, {8})
        assert line, what
        assert proc_state(pid) in ("gone",), f"{args[0]} started pid {pid} ({what})"
    assert outside_snapshot(tmp_path) == before, f"something outside changed ({what})"


MUTATIONS = ["flip", "truncate", "delete"]


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_every_file_damaged(mutation, pristine, tmp_path):
    m = manifest(pristine)
    files = [f["path"] for f in m["files"]]
    assert len(files) >= 5 and any(f.startswith("criu/pages-") for f in files)
    pid = m["pid"]
    refused = []
    ck = copy_of(pristine, tmp_path)
    saved = tmp_path / "saved"
    for i, rel in enumerate(files):
        p = ck / rel
        shutil.copy2(p, saved)
        if mutation == "flip":
            with open(p, "r+b") as f:
                f.seek(p.stat().st_size // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0x01]))
        elif mutation == "truncate":
            os.truncate(p, p.stat().st_size - 1)
        else:
            p.unlink()
        with pytest.raises(ImageInvalid):
            verify(ck)
        refused.append(rel)
        if i == 0 or rel.startswith(("criu/pages-", "device/")):
            # the real CLI too, for a sample: verify and restore both refuse and start nothing (a
            # device image: its import ahead, while CRIU restores, refuses it too)
            assert_refused_everywhere(ck, tmp_path, pid, f"{mutation} {rel}")
        os.replace(saved, p)
    verify(ck)  # every file put back: valid again
    assert refused == files


def test_manifest_damaged_or_missing(pristine, tmp_path):
    pid = manifest(pristine)["pid"]
    ck = copy_of(pristine, tmp_path)
    (ck / "manifest.yaml").write_text("files: [\n")
    assert_refused_everywhere(ck, tmp_path, pid, "unparsable manifest")
    (ck / "manifest.yaml").unlink()
    assert_refused_everywhere(ck, tmp_path, pid, "no manifest")


def test_edited_manifest_is_refused(pristine, tmp_path):
    """A hand edit of any field (not resealed with a new checksum line) is refused."""
    ck = copy_of(pristine, tmp_path)
    text = (ck / "manifest.yaml").read_text()
    m = manifest(ck)
    pid = m["pid"]
    size = m["device"]["bytes"]  # the device's bytes: the first "bytes" of the manifest's lines of JSON
    edited = text.replace(f'"bytes": {size}', f'"bytes": {int(size) + 4096}', 1)
    assert edited != text
    (ck / "manifest.yaml").write_text(edited)
    assert_refused_everywhere(ck, tmp_path, pid, "edited manifest")


def test_manifest_checksum_edit_is_refused(pristine, tmp_path):
    ck = copy_of(pristine, tmp_path)
    m = manifest(ck)
    m["files"][0]["checksum"] = "0" * 32
    write_manifest(ck, m)
    assert_refused_everywhere(ck, tmp_path, m["pid"], "edited checksum")


def test_future_format_version(pristine, tmp_path):
    ck = copy_of(pristine, tmp_path)
    m = manifest(ck)
    m["format_version"] = 99
    write_manifest(ck, m)
    assert_refused_everywhere(ck, tmp_path, m["pid"], "format 99")
    r = npusnap("verify", ck)
    assert "upgrade" in r.stderr


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlinked-file", "symlinked-dir"])
def test_paths_escaping_the_directory(how, pristine, tmp_path):
    ck = copy_of(pristine, tmp_path)
    m = manifest(ck)
    bait = tmp_path / "bait.fifo"
    os.mkfifo(bait, 0o600)  # opening it for reading would block: a read outside shows as a hang
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = m["files"][0]["path"]
    if how == "dotdot":
        m["files"].append({"path": "criu/../../bait.fifo", "size": 1, "checksum": "0" * 32})
        write_manifest(ck, m)
    elif how == "absolute":
        m["files"].append({"path": str(bait), "size": 1, "checksum": "0" * 32})
        write_manifest(ck, m)
    elif how == "symlinked-file":
        (ck / victim).unlink()
        (ck / victim).symlink_to(bait)
    else:  # criu/ itself is a symlink to a copy outside
        shutil.copytree(ck / "criu", outside / "criu")
        shutil.rmtree(ck / "criu")
        (ck / "criu").symlink_to(outside / "criu")
        os.mkfifo(outside / "criu" / "zz-bait.fifo")
    assert_refused_everywhere(ck, tmp_path, m["pid"], how)
    r = npusnap("inspect", ck, timeout=30)
    assert r.returncode in (0, 8), r.stderr  # inspect may show what it can, but never hangs or follows


def test_restore_of_a_good_copy_still_works_after_all_that(pristine, tmp_path):
    """Control: the pristine image itself verifies (so the refusals above are about the damage)."""
    assert npusnap("verify", pristine).returncode == 0
    assert sys.platform.startswith("linux")
