"""`npusnap list` and `npusnap prune` on real checkpoint directories (built with image.Staging)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from npusnap_cli.cli import main
from npusnap_cli.image.format import DeviceState, Manifest
from npusnap_cli.image.staging import Staging
from tests.helpers import kill_and_wait, npusnap, requires_criu


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def make(final: Path, day: int, payload: bytes = b"p" * 4096, device: str = "none") -> Path:
    s = Staging(final)
    (s.criu_dir / "pages-1.img").write_bytes(payload)
    (s.device_dir / "dev0.img").write_bytes(b"d" * 100)
    m = Manifest(pid=1000 + day, created=f"2024-01-{day:02d}T12:00:00+00:00", host="h", kernel="k",
                 npusnap_version="0.1.0", criu_version="4.2.1", command=["python", "train.py", "--lr", "0.1"],
                 device=DeviceState(backend=device), files=s.seal())
    return s.commit(m)


def age(path: Path, seconds: float) -> None:
    """Make everything under path look unchanged for `seconds`."""
    t = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (t, t), follow_symlinks=False)
    os.utime(path, (t, t))


def listing(capsys: pytest.CaptureFixture[str], *args: object) -> dict[str, dict[str, Any]]:
    rc, out, err = run(capsys, "list", *args, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["kind"] == "list"
    return {Path(c["path"]).name: c for c in doc["checkpoints"]}


@pytest.fixture
def store(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for day in (1, 2, 3, 4):
        make(d / f"job-{day}", day, device="sim" if day == 4 else "none")
    # job-5: newest, but a file was truncated; job-6: same sizes, altered bytes (only --verify sees it)
    make(d / "job-5", 5)
    with open(d / "job-5" / "criu" / "pages-1.img", "r+b") as f:
        f.truncate(10)
    make(d / "job-6", 6)
    (d / "job-6" / "device" / "dev0.img").write_bytes(b"X" * 100)
    fresh = Staging(d / "job-7")                               # being written right now
    stale = Staging(d / "job-0")                               # its writer died two hours ago
    (stale.criu_dir / "core.img").write_bytes(b"c" * 50)
    age(stale.path, 7200)
    (d / "not-a-checkpoint").mkdir()
    (d / "not-a-checkpoint" / "data.bin").write_bytes(b"keep me")
    (d / "notes.txt").write_text("keep me")
    outside = make(tmp_path / "elsewhere", 1)
    (d / "link-to-a-checkpoint").symlink_to(outside)
    (d / "fresh-name").write_text(fresh.path.name)  # remember it for the tests
    return d


def test_list_states(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    cps = listing(capsys, store)
    hidden = {n for n in cps if n.startswith(".")}
    assert {n for n in cps if not n.startswith(".")} == {"job-1", "job-2", "job-3", "job-4", "job-5", "job-6"}
    assert len(hidden) == 2 and all(cps[n]["state"] == "incomplete" for n in hidden)
    assert {cps[n]["name"] for n in hidden} == {"job-0", "job-7"}
    assert cps["job-5"]["state"] == "invalid" and "size 10 differs" in cps["job-5"]["problem"]
    assert cps["job-6"]["state"] == "valid"                    # sizes match: only --verify sees it
    j4 = cps["job-4"]
    assert (j4["state"], j4["pid"], j4["device"], j4["bytes"], j4["files"]) == ("valid", 1004, "sim", 4196, 2)
    assert j4["command"] == "python train.py --lr 0.1" and j4["created"] == "2024-01-04T12:00:00+00:00"
    assert j4["disk_bytes"] >= j4["bytes"]
    order = [Path(c["path"]).name for c in json.loads(run(capsys, "list", store, "--json")[1])["checkpoints"]]
    assert order.index("job-6") < order.index("job-4") < order.index("job-1")   # newest first

    verified = listing(capsys, store, "--verify")
    assert verified["job-6"]["state"] == "invalid" and "checksum" in verified["job-6"]["problem"]
    assert verified["job-4"]["state"] == "valid"


def test_list_dir_that_is_itself_a_checkpoint(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    cps = listing(capsys, store / "job-2")
    assert list(cps) == ["job-2"] and cps["job-2"]["state"] == "valid"


def test_list_human_and_empty(capsys: pytest.CaptureFixture[str], store: Path, tmp_path: Path) -> None:
    rc, out, _ = run(capsys, "list", store)
    assert rc == 0 and "job-4" in out and "invalid" in out and "incomplete" in out and "sim" in out
    assert "\x1b[" not in out                                  # not a terminal: no colour
    (tmp_path / "empty").mkdir()
    rc, out, err = run(capsys, "list", tmp_path / "empty")
    assert rc == 0 and out == "" and "no checkpoints" in err
    rc, _, err = run(capsys, "list", tmp_path / "nope")
    assert rc == 2


def tree(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def test_prune_dry_run_changes_nothing(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    before = tree(store)
    rc, out, err = run(capsys, "prune", store, "--keep", "2", "--dry-run", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "prune" and doc["dry_run"] and doc["freed_bytes"] == 0
    assert {d["name"] for d in doc["deleted"]} == {"job-1", "job-2", "job-3", "job-0"}
    assert tree(store) == before


def test_prune(capsys: pytest.CaptureFixture[str], store: Path, tmp_path: Path) -> None:
    fresh = (store / "fresh-name").read_text()
    rc, out, err = run(capsys, "prune", store, "--keep", "2", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert {d["name"] for d in doc["deleted"]} == {"job-1", "job-2", "job-3", "job-0"}
    kept = {d["name"]: d["reason"] for d in doc["kept"]}
    assert set(kept) == {"job-4", "job-5", "job-6", "job-7"} and "invalid" in kept["job-5"]
    assert doc["failed"] == [] and doc["freed_bytes"] >= 3 * (4096 + 100) + 50
    left = {p.name for p in store.iterdir()}
    assert left == {"job-4", "job-5", "job-6", fresh, "not-a-checkpoint", "notes.txt",
                    "link-to-a-checkpoint", "fresh-name"}
    assert (store / "not-a-checkpoint" / "data.bin").read_bytes() == b"keep me"
    assert (tmp_path / "elsewhere" / "manifest.yaml").exists()           # a symlink is never followed
    # idempotent: nothing more to do
    rc, out, err = run(capsys, "prune", store, "--keep", "2")
    assert rc == 0 and out == "" and "nothing to prune" in err


def test_prune_finishes_an_interrupted_removal(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    make(d / "a", 1)
    os.rename(d / "a", d / ".a.deleting-0123abcd")
    make(d / "b", 2)
    rc, out, err = run(capsys, "prune", d, "--keep", "1")
    assert rc == 0, err
    assert "deleted" in out and ".a.deleting-0123abcd" in out
    assert [p.name for p in d.iterdir()] == ["b"]


def test_prune_needs_keep(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    rc, _, err = run(capsys, "prune", store)
    assert rc == 2 and "--keep" in err
    rc, _, err = run(capsys, "prune", store, "--keep", "-1")
    assert rc == 2


def test_prune_reports_what_it_could_not_delete(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    d = tmp_path / "ck"
    d.mkdir()
    make(d / "a", 1)
    make(d / "b", 2)
    d.chmod(0o555)
    try:
        rc, out, err = run(capsys, "prune", d, "--keep", "1", "--json")
    finally:
        d.chmod(0o755)
    assert rc == 12 and json.loads(out)["failed"][0]["name"] == "a"


@requires_criu
def test_list_a_real_checkpoint(tmp_path: Path) -> None:
    p = subprocess.Popen(["setsid", "sleep", "100"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.1)
        (tmp_path / "ck").mkdir()
        npusnap("checkpoint", p.pid, "-D", tmp_path / "ck" / "sleep", "--device", "none", check=True)
        doc = json.loads(npusnap("list", tmp_path / "ck", "--verify", "--json", check=True).stdout)
        [c] = doc["checkpoints"]
        assert (c["state"], c["pid"], c["device"]) == ("valid", p.pid, "none")
        assert "sleep" in c["command"] and c["bytes"] > 0
    finally:
        kill_and_wait(p.pid)
        p.wait()


def _made_at(final: Path, created: str) -> Path:
    s = Staging(final)
    (s.criu_dir / "core.img").write_bytes(b"c" * 64)
    m = Manifest(pid=1, created=created, host="h", kernel="k", npusnap_version="0.1.0", criu_version="4.2.1",
                 files=s.seal())
    return s.commit(m)


def test_prune_keeps_the_newer_of_two_made_in_the_same_second(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    # Sub-second `created` decides, even against name order and manifest mtimes.
    later = _made_at(d / "a-later", "2024-01-01T12:00:00.900000+00:00")
    earlier = _made_at(d / "b-earlier", "2024-01-01T12:00:00.100000+00:00")
    os.utime(later / "manifest.yaml", (1, 1))
    # Whole-second manifests (older npusnap) that tie: the one written last stays.
    old_first = _made_at(d / "m-first", "2023-01-01T12:00:00+00:00")
    old_second = _made_at(d / "n-second", "2023-01-01T12:00:00+00:00")
    t = time.time()
    os.utime(old_first / "manifest.yaml", (t - 10, t - 10))
    order = [Path(c["path"]).name for c in json.loads(run(capsys, "list", d, "--json")[1])["checkpoints"]]
    assert order == ["a-later", "b-earlier", "n-second", "m-first"]
    rc, out, err = run(capsys, "prune", d, "--keep", "1", "--json")
    assert rc == 0, err
    assert sorted(p.name for p in d.iterdir()) == ["a-later"]
    assert not earlier.exists() and not old_second.exists()


@requires_criu
def test_prune_keep_1_after_two_quick_checkpoints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = subprocess.Popen(["setsid", "sleep", "100"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.1)
        d = tmp_path / "ck"
        d.mkdir()
        for name in ("z-first", "a-second"):  # name order opposite to time order
            npusnap("checkpoint", p.pid, "-D", d / name, "--device", "none", "--leave-running", check=True)
        created = load_created(d / "a-second")
        assert "." in created  # sub-second resolution
        rc, out, err = run(capsys, "prune", d, "--keep", "1")
        assert rc == 0, err
        assert [c.name for c in d.iterdir()] == ["a-second"]
    finally:
        kill_and_wait(p.pid)
        p.wait()


def load_created(path: Path) -> str:
    from npusnap_cli.image.format import load_manifest

    return str(load_manifest(path).created)


def make_set(final: Path, day: int, pids: tuple[int, ...] = (2001, 2002)) -> Path:
    """A process set's checkpoint: each member's images under criu/PID/ and device/PID/."""
    from npusnap_cli.image.format import SET_FORMAT_VERSION, MemberEntry, set_device

    s = Staging(final)
    for i, pid in enumerate(pids):
        for sub in (s.criu_dir / str(pid), s.device_dir / str(pid)):
            sub.mkdir()
        (s.criu_dir / str(pid) / "pages-1.img").write_bytes(b"p" * 4096 * (i + 1))
        (s.device_dir / str(pid) / "dev0.img").write_bytes(b"d" * 100)
    members = [MemberEntry(pid=pid, command=["python", "rank.py", str(i)], device=DeviceState(backend="sim", bytes=100))
               for i, pid in enumerate(pids)]
    m = Manifest(pid=pids[0], created=f"2024-01-{day:02d}T12:00:00+00:00", host="h", kernel="k",
                 npusnap_version="0.1.0", criu_version="4.2.1", command=members[0].command,
                 device=set_device([e.device for e in members]), files=s.seal(),
                 format_version=SET_FORMAT_VERSION, members=members)
    return s.commit(m)


def test_list_verify_and_prune_understand_a_set(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    make(tmp_path / "single", 1)
    make_set(tmp_path / "set-old", 2)
    make_set(tmp_path / "set-new", 3)
    found = listing(capsys, tmp_path, "--verify")
    assert found["set-new"]["state"] == "valid" and found["single"]["members"] == []
    assert found["set-new"]["members"] == [{"pid": 2001, "files": 2, "bytes": 4196},
                                           {"pid": 2002, "files": 2, "bytes": 8292}]
    assert found["set-new"]["bytes"] == 4196 + 8292 and found["set-new"]["device"] == "sim"
    rc, out, err = run(capsys, "verify", tmp_path / "set-new", "--json")
    assert rc == 0, err
    members = json.loads(out)["members"]
    assert [m["pid"] for m in members] == [2001, 2002] and members[0]["checksum"] != members[1]["checksum"]
    rc, out, err = run(capsys, "list", tmp_path)
    assert rc == 0 and "2001 2002" in out, out
    rc, out, err = run(capsys, "prune", tmp_path, "--keep", "1", "--json")
    assert rc == 0, err
    assert sorted(Path(d["path"]).name for d in json.loads(out)["deleted"]) == ["set-old", "single"]
    assert not (tmp_path / "set-old").exists() and (tmp_path / "set-new" / "manifest.yaml").is_file()


def test_a_set_whose_member_image_was_altered_fails_verify(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ck = make_set(tmp_path / "set", 1)
    (ck / "criu" / "2002" / "pages-1.img").write_bytes(b"q" * 8192)  # same size, other bytes
    rc, out, err = run(capsys, "verify", ck)
    assert rc == 8 and "criu/2002/pages-1.img: checksum mismatch" in err, err
