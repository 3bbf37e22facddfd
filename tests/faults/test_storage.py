"""Storage faults: no space during the dump, a read-only target, a target that already
holds a checkpoint (refused with 12 unless --replace, which replaces atomically; a
failed --replace keeps the old checkpoint valid)."""

from __future__ import annotations

import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import npusnap

from .support import PausedCli, assert_failed_cleanly, assert_no_valid_checkpoint, assert_running_intact, start_train


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_no_space_during_dump(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env, ballast_mb=40)
    try:
        with tmpfs(tmp_path / "small", "size=20m,mode=0755") as small:
            target = small / "ckpt"
            r = npusnap("checkpoint", w.pid, "-D", target, env=env, timeout=120)
            assert r.returncode != 0, "the dump fitted in 20 MiB?"
            try:
                assert_running_intact(w, reference, env)
                assert_no_valid_checkpoint(target)
                assert not any(small.iterdir()), list(small.iterdir())
            finally:
                pass
            assert_failed_cleanly(r, {12})
    finally:
        w.stop()


def test_read_only_target(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    try:
        with tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
            r = npusnap("checkpoint", w.pid, "-D", ro / "ckpt", env=env, timeout=60)
            assert_failed_cleanly(r, {12})
            assert_running_intact(w, reference, env)
            assert not any(ro.iterdir())
    finally:
        w.stop()


def test_existing_checkpoint_refused_and_replace(npusim_daemon, reference, tmp_path):
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    target = tmp_path / "ckpt"
    cli = None
    try:
        r = npusnap("checkpoint", w.pid, "-D", target, "--leave-running", env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        old = (target / "manifest.yaml").read_bytes()
        # refused without --replace, nothing touched
        r = npusnap("checkpoint", w.pid, "-D", target, env=env, timeout=60)
        line = assert_failed_cleanly(r, {12})
        assert "--replace" in line
        assert (target / "manifest.yaml").read_bytes() == old
        assert_running_intact(w, reference, env)
        # a --replace that fails late (interrupted after the dump) keeps the old one valid
        cli = PausedCli(["checkpoint", w.pid, "-D", target, "--replace"], "before:seal", env)
        cli.proc.send_signal(signal.SIGINT)
        out, err = cli.proc.communicate(timeout=60)
        assert cli.proc.returncode == 130, err
        assert (target / "manifest.yaml").read_bytes() == old
        assert npusnap("verify", target).returncode == 0
        assert_no_valid_checkpoint(tmp_path / "nonexistent")  # (helper sanity)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.")], list(tmp_path.iterdir())
        assert_running_intact(w, reference, env)
        # a --replace that succeeds replaces it: a valid, different checkpoint, no leftovers
        r = npusnap("checkpoint", w.pid, "-D", target, "--replace", "--leave-running", env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert (target / "manifest.yaml").read_bytes() != old
        assert npusnap("verify", target).returncode == 0
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.")]
        assert_running_intact(w, reference, env)
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        w.stop()
