"""The chunk store without CRIU: cutting, packing and reassembling a file, the store's safety."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npusnap_cli.errors import ImageInvalid, StorageProblem
from npusnap_cli.image.format import FileEntry, Manifest, checksum_file
from npusnap_cli.image.store import (
    CHUNK_SIZE,
    STORE_NAME,
    Chunk,
    Packer,
    assembled,
    check_chunks,
    collect,
    cuts,
)

PAGE = 4096


def test_cuts_follow_runs_and_aligned_addresses() -> None:
    # A run of 3 pages ending just past a 64 KiB boundary, then one of 20 pages further on.
    base = 10 * CHUNK_SIZE
    runs = [(base - 2 * PAGE, 3 * PAGE), (base + 5 * CHUNK_SIZE, 20 * PAGE)]
    assert cuts(runs, 23 * PAGE) == [2 * PAGE, PAGE, 16 * PAGE, 4 * PAGE]
    # Runs that do not account for the file: fixed pieces.
    assert cuts(runs, 24 * PAGE) == [CHUNK_SIZE, 8 * PAGE]


def test_chunk_text_round_trip_and_bad_text() -> None:
    c = Chunk("0" * 32, "zstd", 65536, 1234)
    assert Chunk.parse(c.text(), "criu/pages-1.img") == c
    for bad in ("x", "0" * 32 + " gzip 1 1", "0" * 32 + " raw -1 1", 7):
        with pytest.raises(ImageInvalid, match="criu/pages-1.img lists a chunk"):
            Chunk.parse(bad, "criu/pages-1.img")


def _pack(tmp_path: Path, name: str, data: bytes, codec: str) -> tuple[Manifest, Path]:
    root = tmp_path / name
    (root / "criu").mkdir(parents=True)
    path = root / "criu" / "pages-1.img"
    path.write_bytes(data)
    size, digest = checksum_file(path)
    packer = Packer(root, codec)
    try:
        entry = packer.pack(path, FileEntry("criu/pages-1.img", size, digest))
    finally:
        packer.close()
    assert not path.exists()
    return Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="",
                    files=[entry], options={"host_pages": packer.stats.recorded(codec)}), root


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
def test_pack_then_assemble_is_bit_exact_and_dedups(tmp_path: Path, codec: str) -> None:
    data = os.urandom(3 * CHUNK_SIZE) + bytes(range(256)) * 1024 + os.urandom(5000)
    m, root = _pack(tmp_path, "a", data, codec)
    with assembled(root, m) as view:
        assert (view / "pages-1.img").read_bytes() == data
    assert not list((tmp_path / STORE_NAME).glob("restore-*"))  # the view is gone
    m2, _ = _pack(tmp_path, "b", data[:CHUNK_SIZE * 3] + os.urandom(len(data) - 3 * CHUNK_SIZE), codec)
    pages = m2.options["host_pages"]
    assert pages["referenced_bytes"] == 3 * CHUNK_SIZE  # the unchanged chunks were there already


def test_damage_is_named_and_collect_keeps_what_is_referenced(tmp_path: Path) -> None:
    m, root = _pack(tmp_path, "a", os.urandom(4 * CHUNK_SIZE), "none")
    (root / "manifest.yaml").write_text("")  # unreadable: collect must refuse, not delete
    with pytest.raises(StorageProblem):
        collect(tmp_path)
    (root / "manifest.yaml").unlink()  # no checkpoint left: every chunk is unreferenced
    chunk = tmp_path / STORE_NAME / Chunk.parse(m.files[0].chunks[1], "x").rel
    data = bytearray(chunk.read_bytes())
    data[10] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(ImageInvalid, match=r"criu/pages-1.img: chunk [0-9a-f]+ is corrupt"):
        check_chunks(root, m.files, deep=True)
    chunk.unlink()
    with pytest.raises(ImageInvalid, match="is missing from the store"):
        check_chunks(root, m.files, deep=False)
    assert collect(tmp_path)[0] == 3
    assert not any((tmp_path / STORE_NAME / "chunks").rglob("*.raw"))


def test_a_store_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", tmp_path / STORE_NAME)
    (tmp_path / "ck").mkdir()
    with pytest.raises(StorageProblem, match="cannot open the chunk store"):
        Packer(tmp_path / "ck", "none")


def test_a_set_members_device_image_packs_after_its_header_and_reassembles_alone(tmp_path: Path) -> None:
    """--compress on the direct path: a member's device/PID/dev0.img, cut after its 64-byte
    header so the device's 1 MiB chunks fall on chunk boundaries; reassembled (that member
    only) bit-exact, kept where it was (keep=True: --leave-running imports it back)."""
    from npusnap_cli.image.store import DEVICE_CHUNK, DEVICE_HEADER, device_cuts

    assert device_cuts(DEVICE_HEADER + 2 * DEVICE_CHUNK + 10) == [DEVICE_HEADER, DEVICE_CHUNK, DEVICE_CHUNK, 10]
    root = tmp_path / "ck"
    (root / "device" / "7").mkdir(parents=True)
    mem = tmp_path / "mem"
    mem.mkdir()
    data = b"H" * DEVICE_HEADER + (bytes(range(256)) * 8192) + os.urandom(1000)
    (mem / "dev0.img").write_bytes(data)
    size, digest = checksum_file(mem / "dev0.img")
    packer = Packer(root, "zstd")
    try:
        entry = packer.pack(mem / "dev0.img", FileEntry("device/7/dev0.img", size, digest), keep=True)
    finally:
        packer.close()
    assert (mem / "dev0.img").exists() and len(entry.chunks) == 1 + 2 + 1
    stats = packer.device_stats.recorded("zstd")
    assert stats["raw_bytes"] == size and stats["new_bytes"] < size // 4 and packer.stats.raw_bytes == 0
    m = Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="", files=[entry])
    with assembled(root, m, "device", "7") as view:
        assert (view / "7" / "dev0.img").read_bytes() == data
    with assembled(root, m, "device", "8") as view:  # another member's: nothing to reassemble
        assert view == root / "device"
