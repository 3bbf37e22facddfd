"""A live checkpoint's device snapshot (npusim's copy-on-write, native/npusim/cow.h): taken while
the client is locked, written out after it runs on and rewrote its memory; the images hold the
memory as it was at the snapshot. Its copies stay within their bound (beyond it, with no write-out
running, the snapshot ends and its write-out fails clearly, the client never waits), and a
snapshot that is dropped, written out or whose process is gone leaves nothing in the daemon."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import npusim
import pytest

from .support import image_size
from .test_export_import import MiB, _expected, _fill


def _snapshots(daemon) -> int:  # type: ignore[no-untyped-def]
    return int(npusim.daemon_status(daemon.socket)["snapshots"])


def _snapshot_and_run_on(daemon, c, cap: int) -> None:  # type: ignore[no-untyped-def]
    """Lock, snapshot, back up and restore (the kept memory taken back in place), unlock."""
    c.call("lock")
    out = npusim.snapshot_client(daemon.socket, c.pid, cap)
    assert out["snapshot"] is True and out["files"] == [] and out["allocations"] == 4
    c.call("backup_external")
    c.call("restore")
    c.call("unlock")  # no import: the memory never left
    assert _snapshots(daemon) == 1


def test_the_images_hold_the_memory_as_it_was_at_the_snapshot(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    before = c.call("contents")
    _snapshot_and_run_on(npusim_daemon, c, cap=64 * MiB)
    c.call("scribble")  # every byte rewritten by the device (memsets)...
    c.call("py", "npusim.set_device(0); npusim.launch_fill(allocs[0][1], 1024, 3.0)")  # ...and a kernel
    after = c.call("contents")
    assert after != before
    (tmp_path / "ck").mkdir()
    out = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path / "ck", from_snapshot=True)
    assert out["copied_bytes"] >= 10 * MiB  # the chunks rewritten before the write-out came to them
    assert sorted(f["path"] for f in out["files"]) == ["dev0.img", "dev1.img"]
    assert _snapshots(npusim_daemon) == 0  # it ends with its write-out
    assert c.call("contents") == after  # the client's memory is its own

    _restore_from(npusim_daemon, c, tmp_path / "ck", out)  # the images bring back the snapshot's memory
    assert c.call("contents") == before


def _restore_from(daemon, c, images: Path, out: dict) -> None:
    """The client's device memory brought back from the written images (Lock, Backup, Restore, import, Unlock)."""
    c.call("lock")
    c.call("backup_external")
    c.call("restore")
    npusim.import_client(daemon.socket, c.pid, images, _expected(out))
    c.call("unlock")


def test_beyond_its_bound_with_no_write_out_the_snapshot_ends(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    _snapshot_and_run_on(npusim_daemon, c, cap=1 * MiB)
    c.call("scribble")  # 10 MiB to copy aside, room for 1: the client does not wait for anyone
    with pytest.raises(npusim.AclError, match="reached the bound of 1 MiB before the write-out began"):
        npusim.export_client(npusim_daemon.socket, c.pid, tmp_path, from_snapshot=True)
    assert image_size(tmp_path) == 0  # no file left
    assert _snapshots(npusim_daemon) == 0


def test_at_its_bound_a_write_waits_for_the_write_out_running_meanwhile(npusim_daemon, client, tmp_path):
    """1 MiB of copies allowed, 13 chunks rewritten while the images are written: the writes beyond
    the bound wait for the write-out to pass their chunks (the images then hold the memory of the
    snapshot), or, where they came before it began, end the snapshot (its write-out then fails with
    the reason). Either way both finish, and nothing is left in the daemon."""
    c = client()
    _fill(c)
    before = c.call("contents")
    _snapshot_and_run_on(npusim_daemon, c, cap=1 * MiB)
    (tmp_path / "ck").mkdir()
    result: dict = {}

    def write_out() -> None:
        try:
            result["out"] = npusim.export_client(npusim_daemon.socket, c.pid, tmp_path / "ck", from_snapshot=True)
        except npusim.AclError as e:
            result["error"] = str(e)

    t = threading.Thread(target=write_out)
    t.start()
    c.call("scribble")
    t.join(timeout=60)
    assert not t.is_alive(), "the write-out never ended"
    assert _snapshots(npusim_daemon) == 0
    print("outcome:", "lost" if "error" in result else f"written, {result['out']['copied_bytes'] >> 20} MiB copied aside")
    if "error" in result:
        assert "reached the bound of 1 MiB before the write-out began" in result["error"], result
        return
    _restore_from(npusim_daemon, c, tmp_path / "ck", result["out"])
    assert c.call("contents") == before


def test_a_dropped_snapshot_or_one_whose_process_is_gone_leaves_nothing(npusim_daemon, client, tmp_path):
    c = client()
    _fill(c)
    _snapshot_and_run_on(npusim_daemon, c, cap=64 * MiB)
    npusim.export_client(npusim_daemon.socket, c.pid, None, from_snapshot=True)  # dropped
    assert _snapshots(npusim_daemon) == 0
    with pytest.raises(npusim.AclError, match="no live snapshot"):
        npusim.export_client(npusim_daemon.socket, c.pid, tmp_path, from_snapshot=True)

    _snapshot_and_run_on(npusim_daemon, c, cap=64 * MiB)
    c.close()  # the process exits: nobody will write it out
    deadline = time.monotonic() + 30
    while _snapshots(npusim_daemon) != 0:
        assert time.monotonic() < deadline, "the snapshot of a process that is gone stayed"
        time.sleep(0.05)
