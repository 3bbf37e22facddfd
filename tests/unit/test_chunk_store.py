"""The chunk store without CRIU: cutting, packing and reassembling a file, the store's safety."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from npusnap_cli.errors import ImageInvalid, StorageProblem
from npusnap_cli.image.checksums import fsync_all
from npusnap_cli.image.format import FileEntry, Manifest, checksum_file, manifest_text, new_hasher
from npusnap_cli.image.packed import assembled, verify
from npusnap_cli.image.store import (
    CHUNK_SIZE,
    STORE_NAME,
    Chunk,
    Packer,
    Store,
    check_chunks,
    collect,
    cuts,
)
from tests.helpers import damage_chunk, drop_chunk

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
    for bad in ("x", "0" * 32 + " gzip 1 1", "0" * 32 + " raw -1 1", 7, "0" * 32 + " raw 1 99999999999"):
        with pytest.raises(ImageInvalid, match="criu/pages-1.img lists a chunk"):
            Chunk.parse(bad, "criu/pages-1.img")


def _pack(tmp_path: Path, name: str, data: bytes, codec: str, hashed: bool = True) -> tuple[Manifest, Path]:
    """data packed as a checkpoint's page image; hashed: its checksum known before (else the
    packer's, as for CRIU's page images)."""
    root = tmp_path / name
    (root / "criu").mkdir(parents=True)
    path = root / "criu" / "pages-1.img"
    path.write_bytes(data)
    size, digest = checksum_file(path)
    packer = Packer(root, codec)
    try:
        entry = packer.pack(path, FileEntry("criu/pages-1.img", size, digest if hashed else ""))
        assert entry.checksum == digest
        fsync_all(packer.store.to_sync())  # as the seal does: the pack indexed
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
    chunk = Chunk.parse(m.files[0].chunks[1], "x")
    damage_chunk(tmp_path / STORE_NAME, chunk.digest, chunk.codec)
    with pytest.raises(ImageInvalid, match=r"criu/pages-1.img: chunk [0-9a-f]+ is corrupt"):
        check_chunks(root, m.files, deep=True)
    drop_chunk(tmp_path / STORE_NAME, chunk.digest, chunk.codec)
    with pytest.raises(ImageInvalid, match="is missing from the store"):
        check_chunks(root, m.files, deep=False)
    assert collect(tmp_path)[0] == 3
    assert list((tmp_path / STORE_NAME / "packs").iterdir()) == []


def test_an_image_packed_unhashed_gets_its_checksum_and_a_links_pages_are_not_looked_up(tmp_path: Path) -> None:
    m, root = _pack(tmp_path, "a", os.urandom(3 * CHUNK_SIZE), "none", hashed=False)
    with assembled(root, m) as view:  # the checksum the packer took is the one checked on the way back
        assert checksum_file(view / "pages-1.img")[1] == m.files[0].checksum
    (root / "device").mkdir()
    (root / "logs").mkdir()
    chunk = Chunk.parse(m.files[0].chunks[1], "x")
    drop_chunk(tmp_path / STORE_NAME, chunk.digest, chunk.codec)
    verify(root, m, shallow=("criu", "device"), deep=False, pages=False)  # a chain link: its pages are never read
    with pytest.raises(ImageInvalid, match="is missing from the store"):
        verify(root, m, shallow=("criu", "device"), deep=False)


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
        fsync_all(packer.store.to_sync())
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


def _store_one(store: Store, digest: str, data: bytes, how: str, where: Path) -> None:
    """One chunk into the store's pack of this run: appended (put), or a file made a pack (adopt)."""
    if how == "put":
        store.put(digest, "raw", data)
    else:
        where.write_bytes(data)
        assert store.adopt(where, [(digest, 0, len(data))])


@pytest.mark.parametrize("how", ["put", "adopt"])
def test_a_run_killed_before_its_index_leaves_nothing_findable_and_prune_deletes_its_pack(tmp_path: Path,
                                                                                          how: str) -> None:
    """A checkpoint killed while it packs (SIGKILL: no close, no cleanup) leaves a pack without an
    index: no later checkpoint may reference what it holds (its data may not be on the disk), and
    prune deletes it. A run that closes without indexing (a failed checkpoint) deletes its own."""
    data = os.urandom(CHUNK_SIZE)
    kept, root = _pack(tmp_path, "kept", os.urandom(CHUNK_SIZE), "none")
    (root / "manifest.yaml").write_text(manifest_text(kept.to_dict()))
    digest = Chunk.parse(kept.files[0].chunks[0], "x").digest
    pid = os.fork()
    if pid == 0:  # the killed run
        try:
            s = Store(tmp_path / STORE_NAME, create=True)
            _store_one(s, "ab" * 16, data, how, tmp_path / "killed.img")
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    packs = tmp_path / STORE_NAME / "packs"
    orphan = [p for p in packs.glob("*.pack") if not p.with_suffix(".idx").exists()]
    assert len(orphan) == 1 and orphan[0].stat().st_size == len(data)
    with Store(tmp_path / STORE_NAME) as s:
        assert s.find("ab" * 16) is None and s.find(digest) is not None
        _store_one(s, "cd" * 16, data, how, tmp_path / "failed.img")  # closed without to_sync: its pack goes with it
    assert sorted(packs.glob("*.pack")) == sorted([*orphan, *(p.with_suffix(".pack") for p in packs.glob("*.idx"))])
    orphan[0].with_suffix(".tmp").write_text("an index being written when the run was killed")
    assert collect(tmp_path) == (0, len(data))  # "kept" still references its chunk: only the orphan goes
    assert not orphan[0].exists() and not orphan[0].with_suffix(".tmp").exists()
    assert len(list(packs.glob("*.pack"))) == 1


def test_a_store_written_before_packs_still_restores_and_prune_collects_it(tmp_path: Path) -> None:
    """Earlier versions kept a file a chunk (chunks/AB/HEX.CODEC): their checkpoints still verify
    and reassemble bit-exact; once none references them, prune deletes those files."""
    data = os.urandom(CHUNK_SIZE + 100)
    pieces = [data[:CHUNK_SIZE], data[CHUNK_SIZE:]]
    chunks = []
    for piece in pieces:
        h = new_hasher()
        h.update(piece)
        digest = h.hexdigest()
        (tmp_path / STORE_NAME / "chunks" / digest[:2]).mkdir(mode=0o700, parents=True, exist_ok=True)
        (tmp_path / STORE_NAME / "chunks" / digest[:2] / f"{digest}.raw").write_bytes(piece)
        chunks.append(Chunk(digest, "raw", len(piece), len(piece)).text())
    os.chmod(tmp_path / STORE_NAME, 0o700)
    whole = new_hasher()
    whole.update(data)
    root = tmp_path / "old"
    (root / "criu").mkdir(parents=True)
    m = Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="",
                 files=[FileEntry("criu/pages-1.img", len(data), whole.hexdigest(), chunks)])
    (root / "manifest.yaml").write_text(manifest_text(m.to_dict()))
    check_chunks(root, m.files, deep=False)
    check_chunks(root, m.files, deep=True)
    with assembled(root, m) as view:
        assert (view / "pages-1.img").read_bytes() == data
    assert collect(tmp_path) == (0, 0)  # still referenced
    (root / "manifest.yaml").unlink()
    assert collect(tmp_path) == (2, len(data))
    assert not list((tmp_path / STORE_NAME / "chunks").rglob("*.raw"))


@pytest.mark.parametrize("kept", [1, 2])
def test_collect_rewrites_a_pack_once_half_of_it_is_unreferenced(tmp_path: Path, kept: int) -> None:
    """Four chunks in one pack: with one of them referenced (three quarters dead) the pack is
    rewritten with that one only; with two (half dead) too; the referenced ones read back."""
    data = os.urandom(4 * CHUNK_SIZE)
    m, root = _pack(tmp_path, "ck", data, "none")
    entry = m.files[0]
    m.files = [FileEntry(entry.path, kept * CHUNK_SIZE, "", entry.chunks[:kept])]
    (root / "manifest.yaml").write_text(manifest_text(m.to_dict()))
    packs = tmp_path / STORE_NAME / "packs"
    assert collect(tmp_path, dry_run=True, gone={"ck"}) == (4, 4 * CHUNK_SIZE)  # were ck deleted too
    assert collect(tmp_path, dry_run=True) == (4 - kept, (4 - kept) * CHUNK_SIZE)  # what the next does
    assert collect(tmp_path) == (4 - kept, (4 - kept) * CHUNK_SIZE)
    assert sum(p.stat().st_size for p in packs.glob("*.pack")) == kept * CHUNK_SIZE
    check_chunks(root, m.files, deep=False)
    with Store(tmp_path / STORE_NAME) as store:
        for i, c in enumerate(m.files[0].chunks):
            assert store.read(Chunk.parse(c, "x"), "x") == data[i * CHUNK_SIZE:(i + 1) * CHUNK_SIZE]


def test_collect_leaves_a_mostly_referenced_pack_whole(tmp_path: Path) -> None:
    data = os.urandom(4 * CHUNK_SIZE)
    m, root = _pack(tmp_path, "ck", data, "none")
    entry = m.files[0]
    m.files = [FileEntry(entry.path, 3 * CHUNK_SIZE, "", entry.chunks[:3])]
    (root / "manifest.yaml").write_text(manifest_text(m.to_dict()))
    assert collect(tmp_path) == (0, 0)
    assert sum(p.stat().st_size for p in (tmp_path / STORE_NAME / "packs").glob("*.pack")) == 4 * CHUNK_SIZE


def test_packing_holds_what_it_reads_ahead_not_the_images_size(tmp_path: Path) -> None:
    """The page image is read through a mapping: the pages stored are given back as it goes, so the
    packer's resident memory does not grow with the image (96 MiB here; it reads 32 MiB ahead)."""
    import subprocess
    import sys

    size = 96 << 20
    root = tmp_path / "ck"
    (root / "criu").mkdir(parents=True)
    with open(root / "criu" / "pages-1.img", "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    code = f"""
import sys
from pathlib import Path
from npusnap_cli.image.format import FileEntry
from npusnap_cli.image.store import Packer
def hwm():
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
before = hwm()
packer = Packer(Path({str(root)!r}), "none", True)
packer.pack(Path({str(root)!r}) / "criu" / "pages-1.img", FileEntry("criu/pages-1.img", {size}, ""))
packer.close()
print(hwm() - before)
"""
    grew = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert grew < 64 << 20, f"resident memory grew {grew >> 20} MiB packing a {size >> 20} MiB image"


def _write_manifest(root: Path, m: Manifest) -> None:
    (root / "manifest.yaml").write_text(manifest_text(m.to_dict()))  # what prune counts as referencing


def test_a_mostly_new_image_becomes_a_pack_as_it_is_and_prune_counts_what_it_never_indexed(tmp_path: Path) -> None:
    """A page image at least ADOPT new (a first checkpoint into a store) is renamed into the store,
    not copied. Its chunks the store had already, and a repeat of its own, stay in it unindexed:
    dead bytes that prune counts, so it rewrites the pack once half of the file is unreferenced."""
    known = os.urandom(CHUNK_SIZE)
    a, a_root = _pack(tmp_path, "a", known, "none")
    _write_manifest(a_root, a)
    fresh = [os.urandom(CHUNK_SIZE) for _ in range(7)]
    data = known + b"".join(fresh) + fresh[0]  # 9 chunks: 1 in the store, 7 new (7/9 >= ADOPT), 1 repeat
    root = tmp_path / "b"
    (root / "criu").mkdir(parents=True)
    image = root / "criu" / "pages-1.img"
    image.write_bytes(data)
    inode = image.stat().st_ino
    packer = Packer(root, "none", True)
    try:
        entry = packer.pack(image, FileEntry("criu/pages-1.img", len(data), ""))
        fsync_all(packer.store.to_sync())
    finally:
        packer.close()
    packs = tmp_path / STORE_NAME / "packs"
    adopted = next(p for p in packs.glob("*.pack") if p.stat().st_ino == inode)  # the very file
    assert len(adopted.with_suffix(".idx").read_text().splitlines()) == 7
    assert packer.stats.new_bytes == 7 * CHUNK_SIZE and packer.stats.referenced_bytes == 2 * CHUNK_SIZE
    b = Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="", files=[entry])
    with assembled(root, b) as view:
        assert (view / "pages-1.img").read_bytes() == data
    _write_manifest(root, b)
    assert collect(tmp_path) == (0, 0)  # all referenced
    # c references 4 of the 7 new chunks; b goes. 4 of 7 indexed would be most of the index, but
    # the file holds 9 chunks' bytes: less than half of it is referenced, so it is rewritten.
    c, c_root = _pack(tmp_path, "c", b"".join(fresh[:4]), "none")
    _write_manifest(c_root, c)
    (root / "manifest.yaml").unlink()
    assert collect(tmp_path) == (3, 5 * CHUNK_SIZE)
    assert not adopted.exists()
    with assembled(c_root, c) as view:
        assert (view / "pages-1.img").read_bytes() == b"".join(fresh[:4])


def test_an_image_on_another_file_system_than_its_store_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rename = os.rename

    def across(src: Any, dst: Any, **kw: Any) -> None:
        if str(dst).endswith(".pack"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", across)
    data = os.urandom(3 * CHUNK_SIZE)
    m, root = _pack(tmp_path, "a", data, "none")  # all new: it would have been adopted
    with assembled(root, m) as view:
        assert (view / "pages-1.img").read_bytes() == data
    assert len(list((tmp_path / STORE_NAME / "packs").glob("*.pack"))) == 1
