"""--compress auto without CRIU: the race never waits for the codec, its verdict weighs the codec's
rate against the disk's, a tmpfs checkpoint is not compressed, and a device image goes to the
store compressed or stays a plain file, bit-exact either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npusnap_cli.image import codecs, store
from npusnap_cli.image.codecs import Race, effective
from npusnap_cli.image.format import FileEntry, Manifest, checksum_file
from npusnap_cli.image.store import DEVICE_CHUNK, DEVICE_HEADER, Packer, assembled

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
