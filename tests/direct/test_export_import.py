"""The daemon's export/import of a locked client's device memory (the direct path), on a real
daemon with real client processes."""

from __future__ import annotations

import errno
import os
import subprocess

import npusim
import pytest
import xxhash

from npusnap_cli.errors import StorageProblem
from npusnap_cli.image.format import FileEntry
from npusnap_cli.platform import simimages

from .support import ClientError, image_size

MiB = 1 << 20
UNLOCK_FAILED = 507907


def _expected(result: dict) -> list[tuple[str, int, str]]:
    return [(f["path"], f["size"], f["checksum"]) for f in result["files"]]


def _fill(c) -> None:  # type: ignore[no-untyped-def]
    c.call("alloc", 0, 5 * MiB + 96, "random", 1)  # not a whole number of chunks
    c.call("alloc", 0, 3 * MiB, "sparse", 1)
    c.call("alloc", 1, 2 * MiB + 32, "random", 2)
    c.call("alloc", 1, 4096, "zero", 0)


def test_round_trip_bit_exact_across_daemon_restart(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    assert sorted(f["path"] for f in out["files"]) == ["dev0.img", "dev1.img"]
    assert out["allocations"] == 4
    for f in out["files"]:  # the checksum is what npusnap's manifest records: xxh3_128 of the file
        data = (tmp_path / f["path"]).read_bytes()
        assert len(data) == f["size"] and xxhash.xxh3_128(data).hexdigest() == f["checksum"]
        assert (tmp_path / f["path"]).stat().st_mode & 0o777 == 0o600
    c.call("backup_external")  # metadata only: the data is in the files
    assert c.state() == "BACKED_UP"
    with pytest.raises(ClientError) as ei:
        c.call("unlock")  # from an external backup only restore external + import can go back
    assert ei.value.code == UNLOCK_FAILED

    npusim_daemon.restart()  # the device's memory is gone
    c.call("restore")  # re-creates the allocations at their addresses, without data
    assert c.state() == "LOCKED"
    with pytest.raises(ClientError) as ei:
        c.call("unlock")  # the daemon refuses until the data is imported
    assert ei.value.code == UNLOCK_FAILED
    back = npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out))
    assert [f["checksum"] for f in back["files"]] == [f["checksum"] for f in out["files"]]
    assert back["bytes"] == out["bytes"] and back["nonzero_bytes"] == out["nonzero_bytes"]
    c.call("unlock")
    assert c.call("contents") == before  # same addresses (the keys), same bytes


def test_zero_chunks_cost_nothing_on_disk(npusim_daemon, client, tmp_path):
    c = client()
    c.call("alloc", 0, 256 * MiB, "sparse", 100)  # 1 KiB of data in 256 MiB
    c.call("alloc", 0, 64 * MiB, "zero", 0)
    before = c.call("contents")
    c.call("lock")
    (tmp_path / "device").mkdir()
    out = simimages.export_device(c.pid, tmp_path / "device", socket=npusim_daemon.socket)
    assert out.bytes == 320 * MiB and out.nonzero_bytes == MiB
    size = image_size(tmp_path / "device")
    assert size == out.file_bytes and size < MiB + MiB // 100, size  # non-zero bytes + < 1%
    assert [f.path for f in out.files] == ["device/dev0.img"]
    c.call("unlock")
    c.call("scribble")
    c.call("lock")
    simimages.import_device(c.pid, tmp_path / "device", out.files, socket=npusim_daemon.socket)
    c.call("unlock")
    assert c.call("contents") == before  # zero chunks come back as zeros


def test_corrupted_image_refused(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    c.call("backup_external")
    npusim_daemon.restart()
    c.call("restore")
    img = tmp_path / "dev0.img"
    with open(img, "r+b") as f:  # one bit in the first data chunk
        f.seek(64 + 12345)
        b = f.read(1)
        f.seek(64 + 12345)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(npusim.AclError, match="checksum mismatch"):  # the chunk's own checksum
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path)
    with pytest.raises(npusim.AclError, match="checksum mismatch"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out))
    with pytest.raises(ClientError):
        c.call("unlock")  # never runs on a half-imported device
    # a file whose chunks are intact but which is not the one the manifest names
    entries = [FileEntry(f"device/{n}", s, "0" * 32 if n == "dev1.img" else h) for n, s, h in _expected(out)]
    with open(img, "r+b") as f:
        f.seek(64 + 12345)
        f.write(b)  # repaired
    from npusnap_cli.errors import ImageInvalid

    with pytest.raises(ImageInvalid, match="checksum mismatch"):
        simimages.import_device(c.pid, tmp_path, entries, socket=npusim_daemon.socket)
    npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out))
    c.call("unlock")
    assert c.call("contents") == before


def test_a_retry_after_a_failed_import_writes_every_zero_chunk(npusim_daemon, client, tmp_path):
    """An external restore re-creates allocations uncommitted and the import commits them chunk by
    chunk, leaving zero chunks as the kernel gives them. An import that fails part-way has written
    data into them: a retry (another image) must then write its zero chunks, not trust them."""
    c = client()
    addr = c.call("alloc", 0, 4 * MiB, "random", 5)  # every chunk non-zero
    full, sparse = tmp_path / "full", tmp_path / "sparse"
    full.mkdir()
    sparse.mkdir()
    c.call("lock")
    first = npusim.export_client(npusim_daemon.socket, c.pid, full, sync=False)  # fsync left to us
    for f in first["files"]:
        data = (full / f["path"]).read_bytes()  # complete and as reported, fsync'd or not
        assert len(data) == f["size"] and xxhash.xxh3_128(data).hexdigest() == f["checksum"]
    c.call("unlock")
    c.call("py", f"npusim.memset({addr}, 0, {3 * MiB}); npusim.memset({addr + 3 * MiB}, 7, {MiB})")
    before = c.call("contents")
    c.call("lock")
    second = npusim.export_client(npusim_daemon.socket, c.pid, sparse)
    assert second["nonzero_bytes"] == MiB  # three zero chunks, then one of data
    c.call("backup_external")
    c.call("restore")  # re-created uncommitted, awaiting the import
    with open(full / "dev0.img", "r+b") as f:  # the last chunk of the full image is corrupt
        f.seek(64 + 3 * MiB + 100)
        b = f.read(1)
        f.seek(64 + 3 * MiB + 100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(npusim.AclError, match="checksum mismatch"):
        npusim.import_client(npusim_daemon.socket, c.pid, full, _expected(first))
    npusim.import_client(npusim_daemon.socket, c.pid, sparse, _expected(second))
    c.call("unlock")
    assert c.call("contents") == before  # the zero chunks are zero, not the failed import's data


def test_export_refused_unless_locked(npusim_daemon, client, tmp_path):
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    c = client()
    _fill(c)
    with pytest.raises(npusim.AclError, match="not locked"):
        npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    with pytest.raises(npusim.AclError, match="not locked"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(npusim.AclError, match="no npusim client with pid"):
        npusim.export_client(npusim_daemon.socket, os.getpid(), tmp_path)
    c.call("lock")
    npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    c.call("unlock")
    with pytest.raises(npusim.AclError, match="not locked"):  # unlocked again: refused again
        npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)


@pytest.fixture
def small_fs(tmp_path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_is_clear_and_leaves_the_client_locked_and_intact(npusim_daemon, client, small_fs):
    c = client()
    c.call("alloc", 0, 32 * MiB, "random", 3)
    before = c.call("contents")
    c.call("lock")
    with pytest.raises(OSError) as ei:
        npusim.export_client(npusim_daemon.socket, c.pid, small_fs)
    assert ei.value.errno == errno.ENOSPC
    assert "No space left on device" in str(ei.value) and "dev0.img" in str(ei.value)
    with pytest.raises(StorageProblem, match="no space left"):
        simimages.export_device(c.pid, small_fs, socket=npusim_daemon.socket)
    assert list(small_fs.iterdir()) == []  # no partial image left behind
    assert c.state() == "LOCKED"
    c.call("unlock")
    assert c.call("contents") == before


def test_daemon_gone_is_a_clear_error(tmp_path):
    with pytest.raises(npusim.AclError, match="no npusim daemon answers"):
        npusim.export_client(str(tmp_path / "nothing.sock"), 1, tmp_path)


def test_a_kept_export_is_taken_back_in_place_and_freed_when_not(npusim_daemon, client, tmp_path):
    """A live checkpoint's export (keep): the memory outlives the Backup's Release, the restore takes
    it back at the same addresses with its data, and Unlock needs no import; the memory stays
    counted against the device meanwhile. A process restored after a daemon restart has nothing to
    take back: an import is due as ever."""
    c = client()
    _fill(c)
    before = c.call("contents")
    used = npusim.daemon_status(npusim_daemon.socket)["devices"]
    c.call("lock")
    (tmp_path / "a").mkdir()
    npusim.export_client(npusim_daemon.socket, c.pid, tmp_path / "a", keep=True)
    c.call("backup_external")
    assert npusim.daemon_status(npusim_daemon.socket)["devices"] == used  # kept, still counted
    c.call("restore")
    c.call("unlock")  # in place: no import
    assert c.call("contents") == before
    assert npusim.daemon_status(npusim_daemon.socket)["devices"] == used  # taken back, not doubled

    # Kept again, but the daemon restarts: the restore has nothing to take back.
    _back_through_the_import(npusim_daemon, c, tmp_path / "b", before, keep=True, restart=True)


def _back_through_the_import(daemon, c, directory, before, keep: bool, restart: bool = False) -> None:  # type: ignore[no-untyped-def]
    """Lock, export, back up, (restart the daemon,) restore: Unlock is refused until the import."""
    c.call("lock")
    directory.mkdir()
    out = npusim.export_client(daemon.socket, c.pid, directory, keep=keep)
    c.call("backup_external")
    if restart:
        daemon.restart()
    c.call("restore")
    with pytest.raises(ClientError) as ei:
        c.call("unlock")
    assert ei.value.code == UNLOCK_FAILED
    npusim.import_client(daemon.socket, c.pid, directory, _expected(out))
    c.call("unlock")
    assert c.call("contents") == before


def test_an_unlock_ends_a_keep_that_no_backup_followed(npusim_daemon, client, tmp_path):
    """A live checkpoint rolled back after its export: the client unlocks, and a later ordinary
    backup's Release frees the memory as ever (its restore needs the import)."""
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    npusim.export_client(npusim_daemon.socket, c.pid, tmp_path, keep=True)
    c.call("unlock")
    _back_through_the_import(npusim_daemon, c, tmp_path / "b", before, keep=False)


def _start_time(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[19])  # field 22


def test_an_import_ahead_is_taken_back_in_place(npusim_daemon, client, tmp_path):
    """A restore's import ahead (while CRIU restores the process): the daemon reads and checks the
    images into memory kept for the process, whose external restore takes it back at the same
    addresses: no import is due after it (if_due reads nothing), and nothing is counted twice.
    Refused for another process (a start time that does not match) or a connected client."""
    c = client()
    _fill(c)
    before = c.call("contents")
    c.call("lock")
    used = npusim.daemon_status(npusim_daemon.socket)["devices"]
    with pytest.raises(OSError, match="is connected"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, None, ahead_of=_start_time(c.pid))
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    c.call("backup_external")
    assert npusim.daemon_status(npusim_daemon.socket)["devices"] != used  # released
    with pytest.raises(OSError, match="not the one"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out), ahead_of=_start_time(c.pid) + 1)
    ahead = npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out), ahead_of=_start_time(c.pid))
    assert ahead["read_bytes"] == out["written_bytes"] and ahead["nonzero_bytes"] == out["nonzero_bytes"]
    assert npusim.daemon_status(npusim_daemon.socket)["devices"] == used  # kept, counted once
    c.call("restore")
    due = npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out), if_due=True)
    assert due.get("in_place") is True and due["files"] == [] and due["read_bytes"] == 0
    c.call("unlock")  # in place: no import was due
    assert c.call("contents") == before
    assert npusim.daemon_status(npusim_daemon.socket)["devices"] == used


def test_a_failed_import_ahead_keeps_nothing(npusim_daemon, client, tmp_path):
    """A damaged image: the import ahead is refused and gives its memory back; the restore then has
    nothing to take back, and the import that is due refuses the image as ever (the client stays
    locked: nothing unchecked reaches it)."""
    c = client()
    _fill(c)
    c.call("lock")
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path)
    c.call("backup_external")
    released = npusim.daemon_status(npusim_daemon.socket)["devices"]
    img = tmp_path / "dev0.img"
    data = bytearray(img.read_bytes())
    data[len(data) // 3] ^= 0x01
    img.write_bytes(bytes(data))
    with pytest.raises(npusim.AclError, match="checksum mismatch"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out), ahead_of=_start_time(c.pid))
    assert npusim.daemon_status(npusim_daemon.socket)["devices"] == released  # nothing kept
    c.call("restore")
    with pytest.raises(npusim.AclError, match="checksum mismatch"):
        npusim.import_client(npusim_daemon.socket, c.pid, tmp_path, _expected(out), if_due=True)
    with pytest.raises(ClientError) as ei:
        c.call("unlock")
    assert ei.value.code == UNLOCK_FAILED
    assert c.state() == "LOCKED"
