"""--compress auto's remembered verdict (image/store.py: Verdict), end to end on a real daemon with
real CRIU: the first auto checkpoint into a store writes its device images plain, as --compress
none does, and leaves the verdict of its probe on them there; a later one
follows a fresh verdict without probing (plain wins: the export goes to DIR/device as with
--compress none, nothing staged in memory; compressing pays: packed at once); a verdict that is
malformed, a link, another user's or expired is ignored and judged afresh. Every checkpoint
restores bit-exact. No timing is asserted: which way the probe goes depends on this disk."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from npusnap_cli.image import store
from tests.helpers import npusnap, requires_criu

from .support import strip_ready
from .test_incremental import Chain, _argv, _device_bytes

pytestmark = [requires_criu, pytest.mark.criu]

NOBODY = 65534


def _checkpoint(c: Chain, name: str) -> Path:
    """An auto checkpoint of the workload into c.tmp/name (no --parent: a full one, into the store
    beside the others)."""
    ck = c.tmp / name
    r = npusnap("checkpoint", c.w.pid, "-D", ck, "--leave-running", "--data-path", "direct", "--compress", "auto",
                "--json", env=c.env, timeout=120)
    assert r.returncode == 0, r.stderr
    return ck


def _device_images(ck: Path) -> dict:
    return json.loads(npusnap("inspect", ck, "--json", check=True).stdout)["device_images"]


def _plant(parent: Path, verdict: store.Verdict) -> Path:
    """verdict written into parent's store as a probe writes it (the store made if it is not there)."""
    path = parent / store.STORE_NAME
    path.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        store.write_verdict(fd, verdict)
    finally:
        os.close(fd)
    return path / store.VERDICT


def _restore_exactly(c: Chain, ck: Path, ref: list[str]) -> None:
    """The workload run to its end, then ck restored: it runs on from there to the same output."""
    c.finish()
    assert strip_ready(c.w.lines()) == ref
    r = c.restore(ck)
    assert r.returncode == 0, r.stderr
    c.w.wait_exit(timeout=60)
    assert strip_ready(c.w.lines()) == ref


@pytest.mark.parametrize("pays", [False, True], ids=["plain-wins", "compressing-pays"])
def test_a_second_auto_checkpoint_follows_the_remembered_verdict_and_restores_exactly(
        npusim_daemon, reference, tmp_path, pays) -> None:  # type: ignore[no-untyped-def]
    ref = reference(_argv("-", "floats"))
    c = Chain(tmp_path, npusim_daemon.env, "floats")
    try:
        ck0 = _checkpoint(c, "ck0")
        first = _device_images(ck0)
        probed = store.remembered(ck0)  # whichever way it went on this disk, with the rates it measured
        assert probed is not None and probed.dev == os.stat(tmp_path).st_dev
        # the first writes its images plain, as none does, and judges for the next
        assert first["verdict"] == "probed" and first["pays"] is probed.pays, first
        assert first["plain_bytes"] == _device_bytes(ck0) > 0 and first["new_bytes"] == 0, first
        assert sorted(p.name for p in (ck0 / "device").iterdir()) == ["dev0.img"]
        assert (tmp_path / store.STORE_NAME / store.VERDICT).stat().st_mode & 0o777 == 0o600
        # This disk decided one way; each way is followed as remembered.
        _plant(tmp_path, dataclasses.replace(probed, pays=pays))
        c.step(0)
        ck1 = _checkpoint(c, "ck1")
        dev = _device_images(ck1)
        assert dev["verdict"] == "remembered", dev
        plain = sorted(p.name for p in (ck1 / "device").iterdir())
        if pays:  # packed at once, no probe: the device images live in the store only
            assert dev["codec"] == "zstd" and dev["compressed_bytes"] > 0 and "plain_bytes" not in dev, dev
            assert plain == []
        else:  # the --compress none path: the export went to DIR/device, nothing staged or packed
            assert dev["plain_bytes"] == _device_bytes(ck1) > 0 and dev["new_bytes"] == dev["raw_bytes"] == 0, dev
            assert dev["codec"] == "raw" and plain == ["dev0.img"], (dev, plain)
        assert store.remembered(ck1) == store.remembered(ck0)  # followed, not rewritten
        out = npusnap("inspect", ck1, check=True).stdout
        assert f"auto: {'compressing pays' if pays else 'plain wins'} here (remembered" in " ".join(out.replace("│", " ").split())
        assert npusnap("verify", ck1).returncode == 0
        _restore_exactly(c, ck1, ref)
    finally:
        c.w.stop()


@pytest.mark.parametrize("bad", ["malformed", "symlink", "foreign", "expired"])
def test_a_planted_or_stale_verdict_is_ignored_and_judged_afresh(
        npusim_daemon, reference, tmp_path, bad) -> None:  # type: ignore[no-untyped-def]
    """A "plain wins" verdict that does not hold: the checkpoint probes (and its verdict replaces
    the name, never what a link points at)."""
    ref = reference(_argv("-", "floats"))
    fresh = store.Verdict(False, 1e9, 2e8, 0.5, os.stat(tmp_path).st_dev, float(int(time.time())))
    path = _plant(tmp_path, fresh)
    target = tmp_path / "elsewhere"
    if bad == "malformed":
        path.write_text(fresh.text()[:40])
    elif bad == "symlink":
        os.rename(path, target)
        path.symlink_to(target)
    elif bad == "foreign":
        os.chown(path, NOBODY, NOBODY)
    else:
        _plant(tmp_path, dataclasses.replace(fresh, at=fresh.at - store.VERDICT_TTL_S - 3600))
    assert store.remembered(tmp_path / "ck0") is None
    c = Chain(tmp_path, npusim_daemon.env, "floats")
    try:
        ck0 = _checkpoint(c, "ck0")
        assert _device_images(ck0)["verdict"] == "probed"
        assert store.remembered(ck0) is not None and not path.is_symlink()
        assert path.stat().st_uid == os.geteuid()
        if bad == "symlink":
            assert target.read_text() == fresh.text()
        assert npusnap("verify", ck0).returncode == 0
        _restore_exactly(c, ck0, ref)
    finally:
        c.w.stop()
