"""`npusnap inspect`: one real checkpoint of a small workload, inspected many ways."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.helpers import Workload, criu_works, npusnap, requires_criu

MIB = 1 << 20

# 64 MiB of non-zero memory, an open file, a listening unix socket, two threads.
WORKLOAD = """
import socket, sys, threading, time
workdir = sys.argv[1]
buf = bytearray(b"\\x5a") * (64 << 20)
data = open(workdir + "/data.txt", "w")
data.write("kept open by the workload\\n")
data.flush()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(workdir + "/listen.sock")
sock.listen(1)
threading.Thread(target=lambda: [time.sleep(0.05) for _ in iter(int, 1)], daemon=True).start()
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


class Checkpoint(NamedTuple):
    dir: Path    # the checkpoint directory
    pid: int     # the workload's pid
    work: Path   # the workload's working directory: its file and socket live there


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    if not criu_works():
        pytest.skip("needs a working CRIU >= 4.1 (probed with criu check)")
    work = tmp_path_factory.mktemp("inspect")
    w = Workload([sys.executable, "-c", WORKLOAD, str(work)], work / "out")
    try:
        w.wait_for_line("ready")
        npusnap("checkpoint", w.pid, "-D", work / "ck", "--device", "none", check=True)
        w.proc.wait(timeout=10)   # checkpoint kills the original, like `criu dump`
        return Checkpoint(work / "ck", w.pid, work)
    finally:
        w.stop()


@pytest.fixture(scope="module")
def inspected(checkpoint: Checkpoint) -> dict[str, Any]:
    r = npusnap("inspect", checkpoint.dir, "--json", check=True)
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def process(doc: dict[str, Any], pid: int) -> dict[str, Any]:
    found: list[dict[str, Any]] = [p for p in doc["processes"] if p["pid"] == pid]
    assert len(found) == 1, doc["processes"]
    return found[0]


def relinked(ck: Checkpoint, tmp_path: Path) -> Path:
    """A copy of the checkpoint made of hard links (cheap); tests never write through them."""
    dest = tmp_path / "ck"
    shutil.copytree(ck.dir, dest, copy_function=os.link)
    return dest


def rewrite(path: Path, text: str) -> None:
    """Replace a file; a manifest is resealed, so what is tested is what follows its checksum."""
    from npusnap_cli.image.format import MANIFEST, seal_manifest_text

    path.unlink()   # break the hard link first
    path.write_text(seal_manifest_text(text) if path.name == MANIFEST else text)


def assert_one_line_error(r: subprocess.CompletedProcess[str], code: int = 8) -> str:
    """Exit code 8 (image invalid), one line on stderr, no traceback, nothing on stdout."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("npusnap: error: ") and "Traceback" not in r.stderr
    assert r.stdout == ""
    return r.stderr


# ---------------------------------------------------------------- the model


@requires_criu
def test_json_header_and_process(inspected: dict[str, Any], checkpoint: Checkpoint) -> None:
    assert inspected["schema"] == 1 and inspected["kind"] == "inspect"
    assert inspected["pid"] == checkpoint.pid
    assert inspected["directory"] == str(checkpoint.dir.absolute())
    assert inspected["criu_version"] and inspected["kernel"] == os.uname().release
    assert inspected["options"]["leave_running"] is False
    proc = process(inspected, checkpoint.pid)
    assert proc["comm"].startswith("python")
    assert proc["command"][:2] == [sys.executable, "-c"]
    assert proc["ppid"] == os.getpid()   # the manifest's real parent, not pstree's 0
    assert len(proc["threads"]) >= 2 and proc["threads"][0]["tid"] == checkpoint.pid


@requires_criu
def test_json_memory(inspected: dict[str, Any], checkpoint: Checkpoint) -> None:
    mem = process(inspected, checkpoint.pid)["memory"]
    assert mem["dumped"] >= 64 * MIB and inspected["memory_dumped"] >= mem["dumped"]
    kinds = {k["kind"]: k for k in mem["kinds"]}
    assert kinds["anonymous"]["dumped"] >= 64 * MIB   # the buffer is private anonymous memory
    assert sum(k["dumped"] for k in kinds.values()) == mem["dumped"]
    assert sum(k["mapped"] for k in kinds.values()) == mem["mapped"] >= mem["dumped"]
    # Sizes come from the pagemap; they must agree with the pages images' real sizes.
    pages = sum(f["size"] for f in inspected["images"]["files"]
                if f["path"].startswith("criu/pages-"))
    assert pages == inspected["memory_dumped"] and inspected["notes"] == []


@requires_criu
def test_json_files_and_sockets(inspected: dict[str, Any], checkpoint: Checkpoint) -> None:
    proc = process(inspected, checkpoint.pid)
    data = str(checkpoint.work / "data.txt")
    [f] = [f for f in proc["files"] if f["path"] == data]
    assert (f["type"], f["access"]) == ("reg", "w")
    out = str(checkpoint.work / "out")
    assert {f["fd"] for f in proc["files"] if f["path"] == out} == {1, 2}
    [unix] = [s for s in proc["sockets"] if s["family"] == "unix"]
    sock = str(checkpoint.work / "listen.sock")
    assert (unix["local"], unix["type"], unix["state"]) == (sock, "stream", "listen")
    assert unix["fd"] not in {f["fd"] for f in proc["files"]}


@requires_criu
def test_json_device_phases_images(inspected: dict[str, Any], checkpoint: Checkpoint) -> None:
    assert inspected["device"]["backend"] == "none"
    assert "dump" in [p["name"] for p in inspected["phases"]]
    for p in inspected["phases"]:
        assert (p["throughput"] is not None) == (p["bytes"] > 0 and p["seconds"] > 0)
    images = inspected["images"]
    on_disk = sum(p.stat().st_size for p in (checkpoint.dir / "criu").iterdir())
    assert images["by_directory"]["criu"] == on_disk
    assert images["total"] == sum(f["size"] for f in images["files"]) >= on_disk


@requires_criu
def test_human_view(checkpoint: Checkpoint) -> None:
    r = npusnap("inspect", checkpoint.dir, check=True, env={**os.environ, "COLUMNS": "400"})
    assert str(checkpoint.pid) in r.stdout
    assert str(checkpoint.work / "data.txt") in r.stdout
    assert str(checkpoint.work / "listen.sock") in r.stdout
    assert "threads (2)" in r.stdout and "anonymous" in r.stdout
    assert r.stderr == ""
    narrow = npusnap("inspect", checkpoint.dir, check=True, env={**os.environ, "COLUMNS": "40"})
    assert "listen.sock" in narrow.stdout   # long lines fold; nothing is cut off


# ---------------------------------------------------------------- refusals


def test_missing_directory(tmp_path: Path) -> None:
    assert_one_line_error(npusnap("inspect", tmp_path / "nope"))


def test_missing_manifest(tmp_path: Path) -> None:
    (tmp_path / "criu").mkdir()
    assert "manifest.yaml" in assert_one_line_error(npusnap("inspect", tmp_path, "--json"))


@pytest.mark.parametrize("text", ["pid: [1, 2\n", "- a list\n", "", "format_version: 1\npid: x\n"])
def test_malformed_manifest(tmp_path: Path, text: str) -> None:
    (tmp_path / "manifest.yaml").write_text(text)
    assert_one_line_error(npusnap("inspect", tmp_path))


@requires_criu
def test_manifest_value_of_the_wrong_type(checkpoint: Checkpoint, tmp_path: Path) -> None:
    ck = relinked(checkpoint, tmp_path)
    m = ck / "manifest.yaml"
    rewrite(m, m.read_text().replace("pid:", "pid: [not, a, pid]\nold_pid:", 1))
    assert "manifest" in assert_one_line_error(npusnap("inspect", ck))


@requires_criu
def test_manifest_path_outside_is_refused(checkpoint: Checkpoint, tmp_path: Path) -> None:
    ck = relinked(checkpoint, tmp_path)
    m = ck / "manifest.yaml"
    text = m.read_text()
    assert '"path": "criu/files.img"' in text  # one JSON value a line (image/format.py: flow_yaml)
    rewrite(m, text.replace('"path": "criu/files.img"', '"path": "../../etc/passwd"'))
    assert "outside the checkpoint" in assert_one_line_error(npusnap("inspect", ck))


@requires_criu
@pytest.mark.parametrize("pattern", ["files.img", "pages-*.img"])
def test_symlinked_image_is_refused(checkpoint: Checkpoint, tmp_path: Path, pattern: str) -> None:
    ck = relinked(checkpoint, tmp_path)
    target = min((ck / "criu").glob(pattern))
    outside = tmp_path / "outside.img"
    os.link(target, outside)
    target.unlink()
    target.symlink_to(outside)
    assert "symlink" in assert_one_line_error(npusnap("inspect", ck, "--json"))


@requires_criu
def test_symlinked_image_directory_is_refused(checkpoint: Checkpoint, tmp_path: Path) -> None:
    ck = relinked(checkpoint, tmp_path)
    (ck / "criu").rename(tmp_path / "elsewhere")
    (ck / "criu").symlink_to(tmp_path / "elsewhere")
    assert "symlink" in assert_one_line_error(npusnap("inspect", ck))


@requires_criu
@pytest.mark.parametrize("garbage", [b"\x00" * 3, b"\xde\xad\xbe\xef" * 64])
def test_undecodable_image(checkpoint: Checkpoint, tmp_path: Path, garbage: bytes) -> None:
    ck = relinked(checkpoint, tmp_path)
    mm = ck / "criu" / f"mm-{checkpoint.pid}.img"
    mm.unlink()   # a new file: never write through the hard link
    mm.write_bytes(garbage)
    assert f"criu/mm-{checkpoint.pid}.img" in assert_one_line_error(npusnap("inspect", ck))


@requires_criu
def test_image_of_the_wrong_kind(checkpoint: Checkpoint, tmp_path: Path) -> None:
    ck = relinked(checkpoint, tmp_path)
    (ck / "criu" / "files.img").unlink()
    os.link(ck / "criu" / f"core-{checkpoint.pid}.img", ck / "criu" / "files.img")
    assert "not FILES" in assert_one_line_error(npusnap("inspect", ck))


@requires_criu
def test_optional_images_absent(checkpoint: Checkpoint, tmp_path: Path) -> None:
    """Images the manifest does not list are skipped: their sections are just empty."""
    ck = relinked(checkpoint, tmp_path)
    m = ck / "manifest.yaml"
    doc = yaml.safe_load(m.read_text())
    doc["files"] = [f for f in doc["files"]
                    if not f["path"].startswith(("criu/files.img", "criu/fdinfo-"))]
    rewrite(m, yaml.safe_dump(doc))
    r = npusnap("inspect", ck, "--json", check=True)
    proc = process(json.loads(r.stdout), checkpoint.pid)
    assert proc["files"] == [] and proc["sockets"] == [] and proc["memory"]["dumped"] >= 64 * MIB


# ---------------------------------------------------------------- rendering


def test_values_from_the_directory_cannot_inject_markup_or_escapes() -> None:
    from npusnap_cli.commands.inspect import _clean, _t

    hostile = "x[bold]y[/bold]\x1b[31mred\x07"
    text = _t("name: " + _clean(hostile)).plain
    assert "\x1b" not in text and "\x07" not in text
    assert "[bold]" in text and "\\x1b" in text
