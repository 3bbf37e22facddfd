"""The restore's readahead of device images (image/prefetch.py): it reads ahead what the
manifest names, in order, within its bound; it never follows a link planted in the checkpoint
and never hangs on a FIFO; and it stops when the restore is done with it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from npusnap_cli.image import prefetch as prefetch_mod
from npusnap_cli.image.format import FileEntry
from npusnap_cli.image.prefetch import STEP, Prefetch

MIB = 1 << 20


def _image(root: Path, name: str, size: int) -> FileEntry:
    (root / "device").mkdir(exist_ok=True)
    path = root / "device" / name
    with open(path, "wb") as f:
        f.truncate(size)
    return FileEntry(f"device/{name}", size, "")


def _run(p: Prefetch) -> Prefetch:
    with p:
        p.thread.join(timeout=30)  # it ends by itself once everything was asked for
        assert not p.thread.is_alive()
    return p


def test_every_named_byte_is_asked_for_in_order(tmp_path: Path) -> None:
    entries = [_image(tmp_path, "dev0.img", 3 * STEP + 5), _image(tmp_path, "dev1.img", MIB)]
    p = _run(Prefetch(tmp_path, entries, limit=1 << 40))
    assert p.requested == 3 * STEP + 5 + MIB


def test_the_bound_holds(tmp_path: Path) -> None:
    entries = [_image(tmp_path, "dev0.img", 4 * STEP), _image(tmp_path, "dev1.img", 4 * STEP)]
    p = _run(Prefetch(tmp_path, entries, limit=5 * STEP + 7))
    assert p.requested == 5 * STEP + 7


def test_a_quarter_of_the_available_memory_at_most(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch_mod, "_available", lambda: 4 * STEP)
    p = _run(Prefetch(tmp_path, [_image(tmp_path, "dev0.img", 4 * STEP)], limit=1 << 40))
    assert p.limit == STEP and p.requested == STEP


def test_links_fifos_and_missing_files_are_passed_over(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * MIB)
    (tmp_path / "device").mkdir()
    os.symlink(outside, tmp_path / "device" / "dev0.img")
    os.mkfifo(tmp_path / "device" / "dev1.img")  # opening it for reading must not wait for a writer
    good = _image(tmp_path, "dev2.img", MIB)
    entries = [FileEntry("device/dev0.img", MIB, ""), FileEntry("device/dev1.img", MIB, ""),
               FileEntry("device/dev9.img", MIB, ""), FileEntry("../outside.bin", MIB, ""), good]
    started = time.monotonic()
    p = _run(Prefetch(tmp_path, entries, limit=1 << 40))
    assert p.requested == MIB  # the regular file inside the checkpoint only
    assert time.monotonic() - started < 30


def test_leaving_stops_it_and_nothing_named_starts_nothing(tmp_path: Path) -> None:
    p = Prefetch(tmp_path, [_image(tmp_path, "dev0.img", 64 * STEP)], limit=1 << 40)
    p.stop.set()  # as if the restore were already done: no request at all
    with p:
        pass
    assert not p.thread.is_alive() and p.requested == 0
    with Prefetch(tmp_path, []) as idle:
        assert not idle.thread.is_alive()
