"""The readahead of device images while the runtime re-creates its allocations
(image/prefetch.py): it asks for the named files, in order, within its window; it never
follows a link planted in the checkpoint and never hangs on a FIFO; it stops when asked."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from npusnap_cli.image import prefetch as prefetch_mod
from npusnap_cli.image.prefetch import STEP, WINDOW, Prefetch

MIB = 1 << 20


def _image(directory: Path, name: str, size: int) -> str:
    with open(directory / name, "wb") as f:
        f.truncate(size)
    return name


def _run(p: Prefetch) -> Prefetch:
    with p:
        p.thread.join(timeout=30)  # it ends by itself once everything was asked for
        assert not p.thread.is_alive()
    return p


def test_every_named_byte_is_asked_for_in_order(tmp_path: Path) -> None:
    names = [_image(tmp_path, "dev0.img", 3 * STEP + 5), _image(tmp_path, "dev1.img", MIB)]
    assert _run(Prefetch(tmp_path, names, limit=1 << 40)).requested == 3 * STEP + 5 + MIB


def test_only_a_window_is_read_ahead(tmp_path: Path) -> None:
    names = [_image(tmp_path, "dev0.img", WINDOW), _image(tmp_path, "dev1.img", WINDOW)]
    assert _run(Prefetch(tmp_path, names)).requested == min(WINDOW, prefetch_mod._available() // 4)
    assert _run(Prefetch(tmp_path, names, limit=5 * STEP + 7)).requested == 5 * STEP + 7


def test_a_quarter_of_the_available_memory_at_most(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch_mod, "_available", lambda: 4 * STEP)
    p = _run(Prefetch(tmp_path, [_image(tmp_path, "dev0.img", 4 * STEP)], limit=1 << 40))
    assert p.limit == STEP and p.requested == STEP


def test_links_fifos_odd_names_and_missing_files_are_passed_over(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * MIB)
    images = tmp_path / "device"
    images.mkdir()
    os.symlink(outside, images / "dev0.img")
    os.mkfifo(images / "dev1.img")  # opening it for reading must not wait for a writer
    good = _image(images, "dev2.img", MIB)
    started = time.monotonic()
    p = _run(Prefetch(images, ["dev0.img", "dev1.img", "dev9.img", "../outside.bin", "..", good], limit=1 << 40))
    assert p.requested == MIB  # the regular file inside the directory only
    assert time.monotonic() - started < 30
    os.symlink(images, tmp_path / "linked")  # a directory reached through a link is not read either
    assert _run(Prefetch(tmp_path / "linked", [good], limit=1 << 40)).requested == 0


def test_leaving_stops_it_and_nothing_named_starts_nothing(tmp_path: Path) -> None:
    p = Prefetch(tmp_path, [_image(tmp_path, "dev0.img", 64 * STEP)], limit=1 << 40)
    p.stop.set()  # as if the restore were already done: no request at all
    with p:
        pass
    assert not p.thread.is_alive() and p.requested == 0
    with Prefetch(tmp_path, []) as idle:
        assert not idle.thread.is_alive()
