"""Checksums in the pass that moves the data: the follower that hashes CRIU's images while they
are written, the seal that takes its digests, the verifier that checks page images while CRIU
reads them, and the small CRIU image decoder that spares the pipeline pycriu's import."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npusnap_cli.errors import CriuFailed, ImageInvalid
from npusnap_cli.image import staging as staging_mod
from npusnap_cli.image.checksums import BulkVerifier, Follower, page_entries
from npusnap_cli.image.format import FileEntry, Manifest, check_entry, checksum_file, verify
from npusnap_cli.image.staging import Staging
from npusnap_cli.platform.criuimages import (
    CORE_MAGIC,
    FILES_MAGIC,
    PSTREE_MAGIC,
    dumped_tree,
    holds_inet_sockets,
    stopped_at_dump,
)

NEVER = 3600.0  # the follower's own thread never wakes: each test drives catch_up() itself


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_the_follower_hashes_files_as_they_grow(tmp_path: Path) -> None:
    with Follower(tmp_path, interval=NEVER) as follower:
        for i in range(5):
            _append(tmp_path / "pages-1.img", os.urandom(100_000 + i))
            _append(tmp_path / "core-1.img", b"x" * i)
            follower.catch_up(final=False)
        _append(tmp_path / "pages-1.img", b"tail written after the last catch-up")
        (tmp_path / "inventory.img").write_bytes(b"written last")
    digests = follower.digests()
    assert digests == {p.name: checksum_file(p) for p in tmp_path.iterdir()}


def test_a_large_range_is_read_and_hashed_at_once_with_the_same_digest(tmp_path: Path) -> None:
    """hash_fd reads a range over 2 x CHUNK on a thread of its own while it hashes: the digest and
    the count are those of the bytes in order; a file shorter than asked ends the count where
    the file does; a read error is raised, not swallowed."""
    import xxhash

    from npusnap_cli.image.format import CHUNK, hash_fd

    data = os.urandom(2 * CHUNK + 12345) + bytes(CHUNK) + b"tail"
    path = tmp_path / "pages-1.img"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for lo, hi in ((0, len(data)), (777, len(data) - 5), (0, len(data) + (1 << 20))):
            h = xxhash.xxh3_128()
            n = hash_fd(fd, h, lo, hi)
            assert n == min(hi, len(data)) - lo
            assert h.hexdigest() == xxhash.xxh3_128(data[lo:hi]).hexdigest()
    finally:
        os.close(fd)
    entry = FileEntry("pages-1.img", len(data), xxhash.xxh3_128(data).hexdigest())
    check_entry(path, entry)
    with open(path, "r+b") as f:  # one bit flipped deep inside, in the second buffer's turn
        f.seek(CHUNK + 4321)
        f.write(bytes([data[CHUNK + 4321] ^ 0x10]))
    with pytest.raises(ImageInvalid, match="checksum"):
        check_entry(path, entry)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(IsADirectoryError):
            hash_fd(dfd, xxhash.xxh3_128(), 0, 3 * CHUNK)
    finally:
        os.close(dfd)


def test_a_blocked_write_back_holds_neither_the_hashing_nor_a_descriptor(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """sync_file_range blocks while the disk's queue is full: the follower hands it to a thread of
    its own, so the hashing goes on meanwhile; the ranges hashed at the end are left to the seal's
    fsync; once digests() returns, every descriptor the follower and its write-back held is closed."""
    import threading
    import time

    from npusnap_cli.image import checksums

    release, calls = threading.Event(), []

    def blocking_writeback(fd: int, offset: int, length: int) -> None:
        calls.append((os.fstat(fd).st_ino, offset, length))
        release.wait(30)

    monkeypatch.setattr(checksums, "start_writeback", blocking_writeback)
    fds = len(os.listdir("/proc/self/fd"))
    path = tmp_path / "pages-1.img"
    with Follower(tmp_path, interval=NEVER) as follower:
        _append(path, os.urandom(100_000))
        assert follower.catch_up(final=False) == 100_000
        deadline = time.monotonic() + 30
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        _append(path, os.urandom(7_000))  # hashed while the first write-back is still blocked
        assert follower.catch_up(final=False) == 7_000
        _append(path, b"tail")
    threading.Timer(0.2, release.set).start()
    assert follower.digests() == {"pages-1.img": checksum_file(path)}  # waits for the write-back under way
    ino = os.stat(path).st_ino
    # the second range dropped at the end (or, on a slow machine, started before), the tail never asked
    assert calls in ([(ino, 0, 100_000)], [(ino, 0, 100_000), (ino, 100_000, 7_000)])
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_replaced_or_truncated_file_is_hashed_again_from_its_start(tmp_path: Path) -> None:
    with Follower(tmp_path, interval=NEVER) as follower:
        (tmp_path / "a.img").write_bytes(b"first attempt " * 1000)
        (tmp_path / "b.img").write_bytes(b"long content " * 1000)
        follower.catch_up(final=False)
        (tmp_path / "a.img").unlink()  # a retried dump: same name, new file
        (tmp_path / "a.img").write_bytes(b"second attempt")
        os.truncate(tmp_path / "b.img", 0)
        (tmp_path / "b.img").write_bytes(b"short")
        (tmp_path / "gone.img").write_bytes(b"removed before the end")
        follower.catch_up(final=False)
        (tmp_path / "gone.img").unlink()
    assert follower.digests() == {"a.img": checksum_file(tmp_path / "a.img"),
                                  "b.img": checksum_file(tmp_path / "b.img")}


def test_the_follower_keeps_few_descriptors_and_seal_hashes_the_rest(tmp_path: Path) -> None:
    st = Staging(tmp_path / "ck")
    try:
        with st.follow(st.criu_dir) as follower:
            follower.max_files = 3
            for i in range(10):
                (st.criu_dir / f"core-{i}.img").write_bytes(os.urandom(100 + i))
            follower.catch_up(final=False)
            assert len(follower.tails) == 3
        entries = st.seal()
        assert [(e.size, e.checksum) for e in entries] == [checksum_file(st.path / e.path) for e in entries]
        assert len(entries) == 10
    finally:
        st.discard()


def test_seal_takes_the_followers_digests_without_reading_again(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    st = Staging(tmp_path / "ck")
    try:
        with st.follow(st.criu_dir) as follower:
            (st.criu_dir / "pages-1.img").write_bytes(os.urandom(1 << 20))
            follower.catch_up(final=False)
            _append(st.criu_dir / "pages-1.img", b"more")

        def no_second_pass(path: Path) -> tuple[int, str]:
            raise AssertionError(f"{path} was read again")

        monkeypatch.setattr(staging_mod, "checksum_file", no_second_pass)
        [entry] = st.seal()
        monkeypatch.undo()
        assert (entry.path, entry.size) == ("criu/pages-1.img", (1 << 20) + 4)
        assert (entry.size, entry.checksum) == checksum_file(st.criu_dir / "pages-1.img")
    finally:
        st.discard()


def test_seal_reads_a_file_the_follower_did_not_see_whole(tmp_path: Path) -> None:
    st = Staging(tmp_path / "ck")
    try:
        with st.follow(st.criu_dir):
            (st.criu_dir / "pages-1.img").write_bytes(b"a" * 4096)
        st.followers[0].digests = lambda: {"pages-1.img": (10, "stale")}  # type: ignore[method-assign]
        [entry] = st.seal()
        assert (entry.size, entry.checksum) == checksum_file(st.criu_dir / "pages-1.img")
    finally:
        st.discard()


def test_seal_fsyncs_the_device_export_it_does_not_read_again(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct export leaves its files' fsync to the seal (their write-back overlaps CRIU's dump):
    the seal checks their size only, never reads them, and fsyncs them with the rest before the
    commit; a size that changed since the export is refused."""
    st = Staging(tmp_path / "ck")
    try:
        data = os.urandom(3 << 20)
        (st.device_dir / "dev0.img").write_bytes(data)
        known = FileEntry("device/dev0.img", len(data), "from-the-export")
        synced: list[Path] = []
        monkeypatch.setattr(staging_mod, "fsync_all", lambda paths: synced.extend(paths))
        monkeypatch.setattr(staging_mod, "checksum_file", lambda p: pytest.fail(f"{p} was read again"))
        [entry] = st.seal(known=[known])
        assert entry == known
        assert st.device_dir / "dev0.img" in synced and st.device_dir in synced
        assert set(st.parts) == {"checksums", "fsync"} and st.parts["fsync"][1] == len(data)
        _append(st.device_dir / "dev0.img", b"x")
        with pytest.raises(ImageInvalid, match="changed after it was written"):
            st.seal(known=[known])
    finally:
        st.discard()


def test_commit_makes_the_manifest_and_its_directory_durable_before_the_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch of fsyncs (the manifest, the staging directory) before the rename that makes DIR
    valid, then the parent's: the order the durability of a checkpoint rests on."""
    st = Staging(tmp_path / "ck")
    (st.criu_dir / "core-1.img").write_bytes(b"image")
    entries = st.seal()
    events: list[tuple[str, object]] = []
    real_fsync_all, real_fsync_path, real_rename = staging_mod.fsync_all, staging_mod.fsync_path, staging_mod._rename

    def fsync_all(paths: list[Path], threads: int = 8) -> None:
        events.append(("fsync_all", sorted(str(p.relative_to(tmp_path)) for p in paths)))
        assert (st.path / "manifest.yaml").read_text().strip()  # written whole before it is synced
        real_fsync_all(paths, threads)

    def fsync_path(p: Path) -> None:
        events.append(("fsync", str(p.relative_to(tmp_path)) or "."))
        real_fsync_path(p)

    def rename(a: Path, b: Path, flags: int) -> None:
        events.append(("rename", str(b.relative_to(tmp_path))))
        real_rename(a, b, flags)

    monkeypatch.setattr(staging_mod, "fsync_all", fsync_all)
    monkeypatch.setattr(staging_mod, "fsync_path", fsync_path)
    monkeypatch.setattr(staging_mod, "_rename", rename)
    st.commit(_manifest(st.path, [e.path for e in entries]))
    partial = str(st.path.relative_to(tmp_path))
    assert events == [("fsync_all", sorted([f"{partial}/manifest.yaml", partial])), ("rename", "ck"),
                      ("fsync", ".")]
    assert (tmp_path / "ck" / "manifest.yaml").is_file() and not st.path.exists()


def _manifest(root: Path, names: list[str]) -> Manifest:
    files = []
    for name in names:
        size, digest = checksum_file(root / name)
        files.append(FileEntry(name, size, digest))
    return Manifest(pid=1, created="", host="", kernel="", npusnap_version="", criu_version="", files=files)


def test_page_images_are_left_to_the_verifier_and_it_catches_a_bad_one(tmp_path: Path) -> None:
    (tmp_path / "criu").mkdir()
    for name, data in (("pages-1.img", b"p" * 10000), ("pages-12.img", b"q" * 10), ("pagemap-1.img", b"m")):
        (tmp_path / "criu" / name).write_bytes(data)
    m = _manifest(tmp_path, ["criu/pages-1.img", "criu/pages-12.img", "criu/pagemap-1.img"])
    pages = page_entries(m)
    assert [e.path for e in pages] == ["criu/pages-1.img", "criu/pages-12.img"]

    (tmp_path / "criu" / "pages-1.img").write_bytes(b"P" * 10000)  # same size, other bytes
    verify(tmp_path, m, later={e.path for e in pages})  # sizes only, for those
    with pytest.raises(ImageInvalid, match="pages-1.img: checksum mismatch"):
        BulkVerifier(tmp_path, pages, check_entry).start().result()
    os.truncate(tmp_path / "criu" / "pages-12.img", 1)
    with pytest.raises(ImageInvalid, match="pages-12.img: size 1 differs"):
        verify(tmp_path, m, later={e.path for e in pages})


def test_the_verifier_passes_good_images(tmp_path: Path) -> None:
    (tmp_path / "criu").mkdir()
    (tmp_path / "criu" / "pages-1.img").write_bytes(os.urandom(3 << 20))
    m = _manifest(tmp_path, ["criu/pages-1.img"])
    BulkVerifier(tmp_path, page_entries(m), check_entry).start().result()


@pytest.mark.parametrize("read_ahead", [True, False])
def test_the_verifier_reads_each_directorys_page_images_ahead_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    read_ahead: bool) -> None:
    """Once CRIU outruns the verifier its own reads go to the disk in readahead's small steps: the
    verifier asks for every page image, whole, up front (a set's directories each at once), but
    never for a lazy restore, whose first touches need the disk."""
    from npusnap_cli.image import prefetch

    made: list[prefetch.Prefetch] = []

    class Recorded(prefetch.Prefetch):
        def __enter__(self) -> "Recorded":
            made.append(self)
            super().__enter__()
            return self

    monkeypatch.setattr(prefetch, "Prefetch", Recorded)
    for rel, size in (("criu/7/pages-1.img", 3 * prefetch.STEP + 5), ("criu/7/pages-2.img", 10),
                      ("criu/9/pages-1.img", prefetch.STEP)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(os.urandom(size))
    m = _manifest(tmp_path, ["criu/7/pages-1.img", "criu/7/pages-2.img", "criu/9/pages-1.img"])
    BulkVerifier(tmp_path, page_entries(m), check_entry, read_ahead=read_ahead).start().result()
    got = {str(p.directory.relative_to(tmp_path)): (p.names, p.requested) for p in made}
    assert got == ({"criu/7": (["pages-1.img", "pages-2.img"], 3 * prefetch.STEP + 15),
                    "criu/9": (["pages-1.img"], prefetch.STEP)} if read_ahead else {})


# -- CRIU's image format, encoded here the way protobuf does

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def _image(magic: int, *entries: bytes, leading: bool = False) -> bytes:
    head = (0x54564319).to_bytes(4, "little") if leading else b""
    return head + magic.to_bytes(4, "little") + b"".join(len(e).to_bytes(4, "little") + e for e in entries)


def test_pstree_is_read_without_pycriu(tmp_path: Path) -> None:
    root = _field(1, 300) + _field(2, 0) + _field(3, 300) + _field(4, 300) + _field(5, 300) + _field(5, 301)
    child = _field(1, 70000) + _field(2, 300) + _field(5, _varint(70000) + _varint(70001) + _varint(70002))  # packed
    (tmp_path / "pstree.img").write_bytes(_image(PSTREE_MAGIC, root, child, leading=True))
    assert dumped_tree(tmp_path) == [(300, 0, 2), (70000, 300, 3)]


@pytest.mark.parametrize("data", [b"", b"\x01\x02\x03\x04", _image(CORE_MAGIC, _field(1, 5)),
                                  _image(PSTREE_MAGIC, _field(1, 5))[:-1], _image(PSTREE_MAGIC, _field(2, 5)),
                                  _image(PSTREE_MAGIC, b"\x0d")])
def test_a_bad_pstree_is_one_clear_error(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "pstree.img").write_bytes(data)
    with pytest.raises(CriuFailed, match="pstree.img"):
        dumped_tree(tmp_path)


def test_a_process_stopped_at_dump_is_seen_in_its_core_image(tmp_path: Path) -> None:
    def core(pid: int, state: int) -> None:
        entry = _field(1, 1) + _field(3, _field(1, state) + _field(2, 0)) + _field(4, b"\x08\x01")
        (tmp_path / f"core-{pid}.img").write_bytes(_image(CORE_MAGIC, entry))

    core(10, 1)
    core(11, 3)  # TASK_STOPPED
    assert not stopped_at_dump(tmp_path, [10])
    assert stopped_at_dump(tmp_path, [10, 11])
    with pytest.raises(OSError):
        stopped_at_dump(tmp_path, [12])


def test_inet_sockets_in_files_img_are_seen_without_pycriu(tmp_path: Path) -> None:
    """A dump whose tree runs on needs CRIU's network unlock only if files.img lists an INET
    socket; anything the reader is unsure of counts as one. Checked against pycriu's own reading."""
    from pycriu import images

    reg = _field(1, 1) + _field(2, 7)  # file_entry: type REG, id
    inet = _field(1, 4) + _field(2, 8)
    img = tmp_path / "files.img"
    assert not holds_inet_sockets(tmp_path)  # no files.img: nothing was locked
    for entries, held in (((reg,), False), ((reg, inet), True), ((), False)):
        img.write_bytes(_image(FILES_MAGIC, *entries, leading=True))
        assert holds_inet_sockets(tmp_path) is held
        types = [e["type"] for e in images.loads(img.read_bytes())["entries"]]
        assert ("INETSK" in types) is held, types
    img.write_bytes(_image(FILES_MAGIC, reg, leading=True)[:-1])  # truncated: unsure
    assert holds_inet_sockets(tmp_path)
    img.write_bytes(_image(PSTREE_MAGIC, reg, leading=True))  # another image: unsure
    assert holds_inet_sockets(tmp_path)
