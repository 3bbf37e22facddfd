"""Host pages in the chunk store (--dedup, --compress), with real CRIU: what a second checkpoint
writes, what compression saves, bit-exact restores, prune's collection, and damage caught."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    WORKLOADS,
    Workload,
    damage_chunk,
    drop_chunk,
    npusnap,
    proc_state,
    requires_criu,
    rewind_to_checkpoint,
    store_bytes,
)

pytestmark = requires_criu

STATE_MIB = 48  # weights + two Adam moments, 16 MiB each


def _start(tmp_path: Path) -> Workload:
    w = Workload([sys.executable, str(WORKLOADS / "trainstate.py"), str(STATE_MIB)], tmp_path / "run.out")
    w.wait_for_line("ready", timeout=60)
    return w


def _signal_and_wait(w: Workload, sig: signal.Signals, line: str) -> str:
    os.kill(w.pid, sig)
    return [x for x in w.wait_for_line(line) if x.startswith(line)][-1]


def _digest(w: Workload) -> str:
    n = sum(1 for x in w.lines() if x.startswith("digest ")) + 1
    return _signal_and_wait(w, signal.SIGUSR2, f"digest {n} ").split()[2]


def _step(w: Workload, times: int) -> None:
    done = sum(1 for x in w.lines() if x.startswith("stepped "))
    for i in range(times):  # one at a time: signals sent together would merge into one
        _signal_and_wait(w, signal.SIGUSR1, f"stepped {done + i + 1}")


def _pages(ck: Path) -> dict:
    return json.loads(npusnap("inspect", ck, "--json", check=True).stdout)["host_pages"]


def _store_bytes(parent: Path) -> int:
    return store_bytes(parent / ".npusnap-store")


def _restore_and_digest(w: Workload, ck: Path, expected: str) -> None:
    """Kill the original, restore ck, and check the restored state is the checkpointed one, bit for bit."""
    w.stop()
    rewind_to_checkpoint(ck, w.out)
    npusnap("restore", ck, "--detach", check=True)
    assert _digest(w) == expected


def test_second_checkpoint_writes_only_what_changed_and_restores_exactly(tmp_path: Path) -> None:
    w = _start(tmp_path)
    try:
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck1", "--leave-running", "--dedup", check=True)
        first = _pages(tmp_path / "ck1")
        stored_first = _store_bytes(tmp_path)
        # the page image became a pack as it is (all of it new but its repeats): nothing copied
        assert first["codec"] == "raw" and STATE_MIB << 20 < first["new_bytes"] <= stored_first == first["raw_bytes"]
        # Change 10% of the process's host memory (each step rewrites 1% of the state arrays).
        _step(w, math.ceil(0.10 * first["raw_bytes"] / (0.01 * (STATE_MIB << 20))))
        digest = _digest(w)
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck2", "--leave-running", "--dedup", check=True)
        second = _pages(tmp_path / "ck2")
        added = _store_bytes(tmp_path) - stored_first
        assert added == second["new_bytes"] <= 0.15 * first["new_bytes"], (first, second)
        assert second["referenced_bytes"] >= 0.8 * second["raw_bytes"]
        assert not list((tmp_path / "ck2" / "criu").glob("pages-*.img"))  # in the store, not twice
        npusnap("verify", tmp_path / "ck2", check=True)
        _restore_and_digest(w, tmp_path / "ck2", digest)
    finally:
        w.stop()


@pytest.mark.parametrize("codec", ["zstd", "lz4", "auto"])
def test_compressed_training_state_restores_exactly(codec: str, tmp_path: Path) -> None:
    w = _start(tmp_path)
    try:
        digest = _digest(w)
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--leave-running", "--compress", codec, check=True)
        pages = _pages(tmp_path / "ck")
        assert pages["compress"] == codec and pages["new_bytes"] == _store_bytes(tmp_path)
        if codec == "zstd":  # bf16-precision floats: half their bytes are entropy-coded away
            assert pages["raw_bytes"] >= 1.5 * pages["new_bytes"], pages
        elif codec == "lz4":
            assert pages["new_bytes"] < pages["raw_bytes"], pages
        else:  # auto: whatever it chose (that depends on this disk's speed), it is recorded
            assert pages["codec"] in ("raw", "zstd", "lz4")
        npusnap("verify", tmp_path / "ck", check=True)
        _restore_and_digest(w, tmp_path / "ck", digest)
    finally:
        w.stop()


@pytest.fixture
def two_checkpoints(tmp_path: Path):
    """ck1, then ck2 after the state changed; the original killed."""
    w = _start(tmp_path)
    try:
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck1", "--leave-running", "--compress", "zstd", check=True)
        _step(w, 5)
        digest = _digest(w)
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck2", "--leave-running", "--compress", "zstd", check=True)
        yield w, digest
    finally:
        w.stop()


def test_prune_keeps_what_is_referenced(two_checkpoints, tmp_path: Path) -> None:
    """ck2 references most of ck1's pack (5% of the state changed): deleting ck1 leaves that pack
    whole (a pack is rewritten once half of it is unreferenced: tests/unit/test_chunk_store.py);
    ck2 still verifies and restores bit-exact."""
    w, digest = two_checkpoints
    before = _store_bytes(tmp_path)
    dry = json.loads(npusnap("prune", tmp_path, "--keep", "1", "--dry-run", "--json", check=True).stdout)
    assert _store_bytes(tmp_path) == before
    r = npusnap("prune", tmp_path, "--keep", "1", "--json", check=True)
    doc = json.loads(r.stdout)
    assert [d["name"] for d in doc["deleted"]] == ["ck1"]
    assert doc["chunk_bytes"] == before - _store_bytes(tmp_path)
    assert (dry["chunks_deleted"], dry["chunk_bytes"]) == (doc["chunks_deleted"], doc["chunk_bytes"])  # as foretold
    referenced = sum(_chunks(tmp_path, "ck2").values())
    assert referenced <= _store_bytes(tmp_path) <= 2 * referenced
    npusnap("verify", tmp_path / "ck2", check=True)  # every chunk it references is still there
    again = json.loads(npusnap("prune", tmp_path, "--keep", "1", "--json", check=True).stdout)
    assert again["chunks_deleted"] == 0 and again["chunk_bytes"] == 0  # nothing more to collect
    _restore_and_digest(w, tmp_path / "ck2", digest)


def _chunks(tmp_path: Path, ck: str) -> dict[tuple[str, str], int]:
    """The chunks (digest, codec) a checkpoint's manifest references, each with its stored size, in order."""
    import yaml

    m = yaml.safe_load((tmp_path / ck / "manifest.yaml").read_text())
    out = {}
    for f in m["files"]:
        for c in f.get("chunks", []):
            digest, codec, _, stored = c.split()
            out[(digest, codec)] = int(stored)
    return out


def _a_chunk(tmp_path: Path, ck: str) -> tuple[str, str]:
    chunks = list(_chunks(tmp_path, ck))
    return chunks[len(chunks) // 2]


PAGES_CHUNK = re.compile(r"criu/pages-[0-9]+\.img: chunk [0-9a-f]{32} ")


def test_a_flipped_byte_in_a_chunk_is_caught_naming_the_file(two_checkpoints, tmp_path: Path) -> None:
    w, _ = two_checkpoints
    damage_chunk(tmp_path / ".npusnap-store", *_a_chunk(tmp_path, "ck2"))
    v = npusnap("verify", tmp_path / "ck2")
    assert v.returncode == 8 and PAGES_CHUNK.search(v.stderr) and "corrupt" in v.stderr, v.stderr
    w.stop()
    rewind_to_checkpoint(tmp_path / "ck2", w.out)
    r = npusnap("restore", tmp_path / "ck2", "--detach")
    assert r.returncode == 8 and PAGES_CHUNK.search(r.stderr) and "Traceback" not in r.stderr, r.stderr
    assert proc_state(w.pid) == "gone"  # nothing restored from bad pages


def test_a_missing_chunk_is_a_clear_image_error(two_checkpoints, tmp_path: Path) -> None:
    w, _ = two_checkpoints
    drop_chunk(tmp_path / ".npusnap-store", *_a_chunk(tmp_path, "ck2"))
    v = npusnap("verify", tmp_path / "ck2")
    assert v.returncode == 8 and "is missing from the store" in v.stderr and "Traceback" not in v.stderr, v.stderr
    w.stop()
    rewind_to_checkpoint(tmp_path / "ck2", w.out)
    r = npusnap("restore", tmp_path / "ck2", "--detach")
    assert r.returncode == 8 and "is missing from the store" in r.stderr, r.stderr
    assert proc_state(w.pid) == "gone"
