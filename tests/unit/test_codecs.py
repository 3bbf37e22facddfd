"""--compress auto without CRIU: the race never waits for the codec, its verdict weighs the codec's
rate against the disk's, a tmpfs checkpoint is not compressed, and a device image goes to the
store compressed or stays a plain file, bit-exact either way."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from npusnap_cli.image import codecs, store
from npusnap_cli.image.checksums import fsync_all
from npusnap_cli.image.codecs import Race, effective
from npusnap_cli.image.format import FileEntry, Manifest, checksum_file
from npusnap_cli.image.packed import assembled
from npusnap_cli.image.store import DEVICE_CHUNK, DEVICE_HEADER, Packer

DATA = bytes(range(256)) * 4096  # 1 MiB, compressible


def test_auto_stores_raw_what_the_codec_has_not_done_and_a_named_codec_waits() -> None:
    auto = Race("auto")
    try:
        with auto.cond:  # the threads cannot take it before the writer's turn comes
            job = auto.submit(DATA)
            assert auto.taken(job) is None
        done = auto.submit(DATA)
        auto.settle()
        out = auto.taken(done)
        assert out is not None and len(out) < len(DATA) and codecs.decompress("zstd", out, len(DATA)) == DATA
        assert (auto.taken_bytes, auto.passed_bytes) == (len(DATA), len(DATA))
    finally:
        auto.close()
    lz4 = Race("lz4")
    try:
        with lz4.cond:
            job = lz4.submit(DATA)
            out = lz4.taken(job)  # not started: the writer compresses it itself
        assert out is not None and codecs.decompress("lz4", out, len(DATA)) == DATA
        assert lz4.taken(lz4.submit(os.urandom(4096))) is None  # incompressible: stored as it is
    finally:
        lz4.close()


def test_the_verdict_weighs_the_codecs_rate_and_ratio_against_the_disks() -> None:
    race = Race("auto")
    race.threads = [None, None]  # type: ignore[list-item]  # two threads' worth of rate
    race.done = [100e6, 50e6, 0.5]  # 100 MB in 0.5 s a thread, halved
    assert race.pays(100e6)        # a 100 MB/s disk: 400 MB/s of codec, half the bytes
    assert not race.pays(2000e6)   # a 2 GB/s disk outruns the codec
    race.done = [100e6, 95e6, 0.01]
    assert not race.pays(100e6)    # fast, but it saves too little
    race.done = [0, 0, 0.0]
    assert not race.pays(100e6)    # nothing measured: never compress blind
    race.threads = []


def test_auto_into_memory_is_none(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or codecs.fs_type(shm) != codecs.TMPFS_MAGIC:
        pytest.skip("no tmpfs at /dev/shm")
    assert effective("auto", shm / "ck") == "none"
    assert effective("zstd", shm / "ck") == "zstd"
    if codecs.fs_type(tmp_path) != codecs.TMPFS_MAGIC:
        assert effective("auto", tmp_path / "ck") == "auto"


def _image(tmp_path: Path) -> tuple[Path, FileEntry, bytes]:
    mem = tmp_path / "mem"
    mem.mkdir()
    data = b"H" * DEVICE_HEADER + b"".join(bytes([i]) * 64 + DATA[64:] for i in range(6)) + os.urandom(1000)
    (mem / "dev0.img").write_bytes(data)
    size, digest = checksum_file(mem / "dev0.img")
    return mem / "dev0.img", FileEntry("device/dev0.img", size, digest), data


@pytest.mark.parametrize("slow", [True, False])
def test_a_device_image_is_packed_where_compressing_pays_and_plain_where_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    monkeypatch.setattr(store, "PROBE", 2 * DEVICE_CHUNK)
    if slow:
        monkeypatch.setenv("NPUSNAP_TEST_DISK_MBPS", "5")  # slower than any codec
        monkeypatch.setattr(store, "PACE", 0)  # the writer waits for each chunk: the threads are ahead
    else:
        monkeypatch.setattr(Race, "pays", lambda self, rate: False)
    src, entry, data = _image(tmp_path)
    root = tmp_path / "ck"
    (root / "device").mkdir(parents=True)
    packer = Packer(root, "auto")
    try:
        packed = packer.device_image(src, root / entry.path, entry)
        fsync_all(packer.store.to_sync())  # as the seal does
    finally:
        packer.close()
    assert src.read_bytes() == data  # kept in memory for --leave-running's import
    if not slow:
        assert packed is None and (root / entry.path).read_bytes() == data
        return
    assert packed is not None and not (root / entry.path).exists()
    stats = packer.device_stats.recorded("auto")
    assert stats["codec"] == "zstd" and stats["compressed_bytes"] > 0 and stats["new_bytes"] < len(data) // 2
    m = Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="", files=[packed])
    with assembled(root, m, "device") as view:
        assert (view / "dev0.img").read_bytes() == data


# ---------------------------------------------------------------- auto's remembered verdict

def _verdict(root: Path, pays: bool, at: float = 0.0) -> store.Verdict:
    return store.Verdict(pays, 1e9, 2e8, 0.5, os.stat(root.parent).st_dev, at or float(int(time.time())))


def _plant(root: Path, verdict: store.Verdict) -> Path:
    """The verdict written into the store beside root, as a probe writes it."""
    path = root.parent / store.STORE_NAME
    path.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        store.write_verdict(fd, verdict)
    finally:
        os.close(fd)
    return path / store.VERDICT


def _pack_device(root: Path, src: Path, entry: FileEntry) -> tuple[FileEntry | None, dict]:
    (root / "device").mkdir(parents=True, exist_ok=True)
    packer = Packer(root, "auto")
    try:
        packed = packer.device_image(src, root / entry.path, entry)
        fsync_all(packer.store.to_sync())  # as the seal does
    finally:
        packer.close()
    return packed, packer.device_stats.recorded("auto")


def test_the_probes_verdict_is_remembered_and_followed_without_probing_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "PROBE", 2 * DEVICE_CHUNK)
    monkeypatch.setattr(Race, "pays", lambda self, rate: False)
    src, entry, data = _image(tmp_path)
    packed, stats = _pack_device(tmp_path / "ck1", src, entry)
    assert packed is None and stats["verdict"] == "probed"
    kept = tmp_path / store.STORE_NAME / store.VERDICT
    assert kept.stat().st_mode & 0o777 == 0o600
    assert not [p for p in kept.parent.iterdir() if p.name.startswith(".tmp")]
    verdict = store.remembered(tmp_path / "ck2")
    assert verdict is not None and not verdict.pays and verdict.disk_rate > 0 and verdict.codec_rate > 0
    assert 0 < verdict.ratio < 1 and verdict.dev == os.stat(tmp_path).st_dev

    def no_probe(*args: object) -> bool:
        raise AssertionError("probed although a verdict holds")

    monkeypatch.setattr(Packer, "_probe", no_probe)
    packed, stats = _pack_device(tmp_path / "ck2", src, entry)  # plain wins: written as it is
    assert packed is None and (tmp_path / "ck2" / entry.path).read_bytes() == data
    assert stats["verdict"] == "remembered" and stats["new_bytes"] == 0
    _plant(tmp_path / "ck3", _verdict(tmp_path / "ck3", pays=True))
    # auto never waits for the codec: a disk slower than it (each chunk's write waited for) has the
    # threads ahead even on a loaded machine
    monkeypatch.setenv("NPUSNAP_TEST_DISK_MBPS", "10")
    monkeypatch.setattr(store, "PACE", 0)
    packed, stats = _pack_device(tmp_path / "ck3", src, entry)  # compressing pays: packed at once
    assert packed is not None and not (tmp_path / "ck3" / entry.path).exists()
    assert stats["verdict"] == "remembered" and stats["codec"] == "zstd" and stats["compressed_bytes"] > 0
    m = Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="", files=[packed])
    with assembled(tmp_path / "ck3", m, "device") as view:
        assert (view / "dev0.img").read_bytes() == data


@pytest.mark.parametrize("slow", [True, False])
def test_a_first_checkpoints_probe_judges_its_plain_images_for_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    """No verdict yet: the checkpoint wrote its device image plain; probe() judges a sample of it (its
    compression started ahead), keeps the verdict and says what it found; it writes nothing the
    checkpoint keeps (its scratch file in the store is gone) and judges once."""
    monkeypatch.setattr(store, "PROBE", 2 * DEVICE_CHUNK)
    if slow:
        monkeypatch.setenv("NPUSNAP_TEST_DISK_MBPS", "5")  # slower than any codec
    else:
        monkeypatch.setattr(Race, "pays", lambda self, rate: False)
    src, entry, data = _image(tmp_path)
    root = tmp_path / "ck"
    packer = Packer(root, "auto")
    try:
        packer.probe_ahead(src)
        packer.probe(src)
        assert packer.judged and packer.race is None
        packer.probe(src)  # judged once
        fsync_all(packer.store.to_sync())  # as the seal does
    finally:
        packer.close()
    assert src.read_bytes() == data
    stats = packer.device_stats.recorded("auto")
    assert stats["verdict"] == "probed" and stats["pays"] is slow and stats["new_bytes"] == 0, stats
    assert sorted(p.name for p in (tmp_path / store.STORE_NAME).iterdir() if p.name.startswith(".")) == []
    verdict = store.remembered(tmp_path / "ck2")
    assert verdict is not None and verdict.pays is slow and verdict.disk_rate > 0


def test_a_failed_probe_costs_only_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's scratch write fails (a full disk): the checkpoint goes on, no verdict is kept (the
    next auto checkpoint judges again), and none is claimed."""
    from npusnap_cli.errors import StorageProblem
    from npusnap_cli.image import memstage

    def full(*args: object, **kwargs: object) -> int:
        raise StorageProblem("writing the staged images to disk failed: No space left on device")

    monkeypatch.setattr(store, "PROBE", 2 * DEVICE_CHUNK)
    monkeypatch.setattr(memstage, "send", full)
    src, _, _ = _image(tmp_path)
    packer = Packer(tmp_path / "ck", "auto")
    try:
        packer.probe_ahead(src)
        packer.probe(src)
        fsync_all(packer.store.to_sync())  # as the seal does
    finally:
        packer.close()
    assert packer.judged and "verdict" not in packer.device_stats.recorded("auto")
    assert store.remembered(tmp_path / "ck2") is None
    assert not [p for p in (tmp_path / store.STORE_NAME).iterdir() if p.name.startswith(".probe")]


@pytest.mark.parametrize("bad", ["malformed", "wrong-types", "symlink", "foreign", "group-writable", "fifo",
                                 "directory", "huge", "other-fs", "expired", "future"])
def test_a_verdict_that_does_not_hold_is_judged_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       bad: str) -> None:
    root = tmp_path / "ck"
    good = _verdict(root, pays=False)
    path = _plant(root, good)
    assert store.remembered(root) == good
    target = tmp_path / "target"
    if bad == "malformed":
        path.write_text('{"version": 1, "pays": fal')
    elif bad == "wrong-types":
        path.write_text(good.text().replace("false", '"no"'))
    elif bad == "symlink":  # a link to a verdict that would hold is not followed
        os.rename(path, target)
        path.symlink_to(target)
    elif bad == "foreign":
        monkeypatch.setattr(store.os, "geteuid", lambda: os.getuid() + 1)
    elif bad == "group-writable":
        path.chmod(0o620)
    elif bad == "fifo":
        path.unlink()
        os.mkfifo(path, 0o600)
    elif bad == "directory":
        path.unlink()
        path.mkdir(0o700)
    elif bad == "huge":
        path.write_text(good.text()[:-2] + " " * 5000 + "}\n")
    elif bad == "other-fs":
        path.write_text(good.text().replace(f'"st_dev": {good.dev}', f'"st_dev": {good.dev + 1}'))
    else:
        at = time.time() + (-store.VERDICT_TTL_S - 60 if bad == "expired" else 3600)
        _plant(root, store.Verdict(False, 1e9, 2e8, 0.5, good.dev, at))
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert store.read_verdict(fd, good.dev) is None
    finally:
        os.close(fd)
    if bad == "foreign":
        return  # the store itself is not ours under that uid either
    packer = Packer(root, "auto")
    try:
        assert not packer.judged and packer.race is not None  # the next device image is probed
        fsync_all(packer.store.to_sync())  # as the seal does
    finally:
        packer.close()
    if bad in ("symlink", "fifo"):  # the probe's verdict replaces the name, not what it points at
        _plant(root, good)
        assert store.remembered(root) == good and not path.is_symlink()
        if bad == "symlink":
            assert target.read_text() == good.text()
