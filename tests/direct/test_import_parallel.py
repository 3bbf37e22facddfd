"""The daemon's import reads a device image with several threads (chunks in file order, zero
chunks memset, each chunk's XXH3-64 checked by its reader, the file's XXH3-128 fed in order):
images of many chunks come back bit-exact, and damage anywhere, even far into the file while
other chunks are being read, is refused with the client left LOCKED."""

from __future__ import annotations

import npusim
import pytest
import xxhash

from .support import ClientError

MiB = 1 << 20
UNLOCK_FAILED = 507907


def _expected(result: dict) -> list[tuple[str, int, str]]:
    return [(f["path"], f["size"], f["checksum"]) for f in result["files"]]


def _fill(c) -> None:  # type: ignore[no-untyped-def]
    # many chunks, zero chunks in between, allocations not a whole number of chunks
    c.call("alloc", 0, 40 * MiB + 4096, "random", 7)
    c.call("alloc", 0, 9 * MiB, "sparse", 4)
    c.call("alloc", 0, 3 * MiB, "zero", 0)
    c.call("alloc", 0, 23 * MiB + 96, "random", 8)


def _flip(path, offset: int) -> bytes:  # type: ignore[no-untyped-def]
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x80]))
    return b


def _restore(path, offset: int, b: bytes) -> None:  # type: ignore[no-untyped-def]
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b)


def test_many_chunks_round_trip_into_fresh_memory(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    data = (tmp_path / "dev0.img").read_bytes()
    assert xxhash.xxh3_128(data).hexdigest() == out["files"][0]["checksum"]
    for _ in range(2):  # into fresh allocations each time (backup external drops the device memory)
        c.call("backup_external")
        c.call("restore")
        back = npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out))
        assert [f["checksum"] for f in back["files"]] == [f["checksum"] for f in out["files"]]
        assert back["bytes"] == out["bytes"] and back["nonzero_bytes"] == out["nonzero_bytes"]
        assert back["read_bytes"] == out["written_bytes"]
    c.call("unlock")
    assert c.call("contents") == before


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_damage_anywhere_refused_and_client_stays_locked(npusim_daemon, client, tmp_path, where):
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    c.call("backup_external")
    c.call("restore")
    img = tmp_path / "dev0.img"
    data_end = 64 + out["nonzero_bytes"]
    offset = {"first": 64 + 100, "middle": 64 + 33 * MiB + 777, "last": data_end - 5}[where]
    b = _flip(img, offset)
    for expected in (None, _expected(out)):  # the chunk's own checksum refuses it either way
        with pytest.raises(npusim.AclError, match="checksum mismatch") as ei:
            npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, expected)
        assert ei.value.code == 100003
    with pytest.raises(ClientError) as ce:
        c.call("unlock")  # never runs on a half-imported device
    assert ce.value.code == UNLOCK_FAILED
    _restore(img, offset, b)
    npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out))
    c.call("unlock")
    assert c.call("contents") == before


def test_altered_file_with_valid_chunks_refused_by_file_checksum(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    (name, size, digest), = _expected(out)
    other = "0" * 32
    with pytest.raises(npusim.AclError, match="checksum mismatch") as ei:
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, [(name, size, other)])
    assert ei.value.code == 100003
    with pytest.raises(npusim.AclError, match="differs from the expected"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, [(name, size + 1, digest)])
    npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, [(name, size, digest)])
    c.call("unlock")
    assert c.call("contents") == before
