"""Incremental device checkpoints (`checkpoint --parent`), end to end on a real daemon with real
CRIU: a workload that changes a known tenth of its device memory per step, checkpointed with
--leave-running between steps; each link of the chain restores bit-exact (every later step's
digest covers all of its device memory), a flipped byte anywhere in the chain is caught, and
verify, prune and inspect understand chains."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import Workload, chunk_place, npusnap, requires_criu, rewind_to_checkpoint

from .support import strip_ready, under_agent

pytestmark = [requires_criu, pytest.mark.criu]

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "npusim_dirty.py"
STEPS = 12
MiB = 1 << 20


def _argv(gate: str, *mode: str) -> list[str]:
    return [sys.executable, str(WORKLOAD), str(STEPS), gate, *mode]


def _device_bytes(ck: Path) -> int:
    m = yaml.safe_load((ck / "manifest.yaml").read_text())
    return sum(f["size"] for f in m["files"] if f["path"].startswith("device/"))


class Chain:
    """The workload, gated step by step, and its checkpoints ck0 (full), ck1, ... (each the
    parent of the next), taken after step k-1 and before step k."""

    def __init__(self, tmp: Path, env: dict[str, str], *mode: str) -> None:
        self.tmp, self.env = tmp, env
        self.gate = tmp / "gate"
        self.gate.mkdir()
        self.w = Workload(under_agent(_argv(str(self.gate), *mode)), tmp / "dirty.out", env=env)
        self.w.wait_for_line("ready pid", timeout=60)
        self.links: list[Path] = []

    def step(self, k: int) -> None:
        (self.gate / f"go-{k}").touch()
        self.w.wait_for_line(f"step {k} ", timeout=60)

    def checkpoint(self, *extra: str) -> dict:
        ck = self.tmp / f"ck{len(self.links)}"
        parent = ["--parent", str(self.links[-1])] if self.links else []
        r = npusnap("checkpoint", self.w.pid, "-D", ck, "--leave-running", "--data-path", "direct", "--json",
                    *parent, *extra, env=self.env, timeout=120)
        assert r.returncode == 0, r.stderr
        self.links.append(ck)
        return json.loads(r.stdout)

    def finish(self) -> None:
        for k in range(STEPS):
            (self.gate / f"go-{k}").touch()
        self.w.wait_exit(timeout=60)
        self.w.proc.wait(timeout=10)  # reaped: a zombie would hold the pid a restore needs

    def restore(self, ck: Path) -> "subprocess.CompletedProcess[str]":  # noqa: F821
        rewind_to_checkpoint(ck, self.w.out)
        return npusnap("restore", ck, env=self.env, timeout=120)


@pytest.fixture
def chain(npusim_daemon, tmp_path):  # type: ignore[no-untyped-def]
    c = Chain(tmp_path, npusim_daemon.env)
    try:
        yield c
    finally:
        c.w.stop()


def test_second_checkpoint_writes_only_what_changed(chain, reference) -> None:  # type: ignore[no-untyped-def]
    ref = reference(_argv("-"))
    first = chain.checkpoint()
    assert first["device"]["referenced"] == 0 and first["parent"] is None
    chain.step(0)  # 7 of 64 MiB rewritten
    second = chain.checkpoint()
    full, incr = _device_bytes(chain.links[0]), _device_bytes(chain.links[1])
    assert full >= 64 * MiB
    assert incr <= 0.15 * full, (incr, full)
    assert second["device"]["referenced"] == 64 * MiB - 7 * MiB
    assert second["parent"] == str(chain.links[0].absolute())
    m = yaml.safe_load((chain.links[1] / "manifest.yaml").read_text())
    assert m["parent"]["path"] == "../ck0"

    chain.finish()
    assert strip_ready(chain.w.lines()) == ref
    r = chain.restore(chain.links[1])  # from step 1 on, through both links
    assert r.returncode == 0, r.stderr
    chain.w.wait_exit(timeout=60)
    assert strip_ready(chain.w.lines()) == ref


def test_chain_of_ten_restores_from_any_link_and_prune_verify_inspect(chain, reference) -> None:  # type: ignore[no-untyped-def]
    ref = reference(_argv("-"))
    for k in range(10):
        chain.checkpoint()
        chain.step(k)
    links = chain.links
    chain.finish()
    for ck in (links[9], links[4], links[0]):  # the end, the middle, the full one
        r = chain.restore(ck)
        assert r.returncode == 0, r.stderr
        chain.w.wait_exit(timeout=60)
        assert strip_ready(chain.w.lines()) == ref, ck

    # verify checks the whole chain; inspect shows new vs referenced bytes.
    v = npusnap("verify", links[9], "--json")
    assert v.returncode == 0, v.stderr
    assert json.loads(v.stdout)["chain"] == [str(p.absolute()) for p in reversed(links[:9])]
    i = npusnap("inspect", links[9], "--json")
    assert i.returncode == 0, i.stderr
    c = json.loads(i.stdout)["chain"]
    assert c["parent"] == str(links[8].absolute())
    assert c["device_new"] == _device_bytes(links[9]) and c["device_referenced"] == 57 * MiB
    text = npusnap("inspect", links[9])
    assert "referenced in the parent chain" in text.stdout

    # prune --keep 1 keeps the newest link and everything it references.
    p = npusnap("prune", chain.tmp, "--keep", "1", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["deleted"] == []
    assert all(ck.is_dir() for ck in links)


def test_flipped_byte_anywhere_in_the_chain_is_caught(chain) -> None:  # type: ignore[no-untyped-def]
    for k in range(3):
        chain.checkpoint()
        chain.step(k)
    chain.finish()
    ck0, ck1, ck2 = chain.links
    # A chunk ck2 references lives in ck0 (untouched since the full checkpoint): flip one byte
    # in ck0's data, past its 64-byte header.
    img = ck0 / "device" / "dev0.img"
    with open(img, "r+b") as f:
        f.seek(64 + 40 * MiB + 123)  # allocation 2, chunk 8: only ever written at the start
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))
    v = npusnap("verify", ck2)
    assert v.returncode == 8 and "ck0" in v.stderr and "dev0.img" in v.stderr, v.stderr
    r = chain.restore(ck2)
    assert r.returncode == 8, r.stderr
    assert f"{ck0}/device/dev0.img" in r.stderr and "checksum mismatch" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # one clear line (and a hint), no traceback


def test_parent_of_another_process_is_refused(chain, npusim_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    chain.checkpoint()
    other = Workload(under_agent(_argv("-")), tmp_path / "other.out", env=npusim_daemon.env)
    try:
        other.wait_for_line("ready pid", timeout=60)
        r = npusnap("checkpoint", other.pid, "-D", tmp_path / "x", "--leave-running",
                    "--parent", chain.links[0], env=npusim_daemon.env, timeout=120)
        assert r.returncode == 8, r.stderr
        assert f"process {chain.w.pid}, not {other.pid}" in r.stderr
        assert not (tmp_path / "x").exists()
    finally:
        other.stop()
    missing = npusnap("checkpoint", chain.w.pid, "-D", tmp_path / "y", "--parent", tmp_path / "nope",
                      env=npusim_daemon.env)
    assert missing.returncode == 8 and "nope" in missing.stderr, missing.stderr


def test_rolled_back_checkpoint_keeps_the_changes_for_the_next(chain, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint that fails after the export (its CRIU dump is refused) is rolled back and
    never becomes a parent; the next one against the committed parent still has every change."""
    ref = reference(_argv("-"))
    chain.checkpoint()
    chain.step(0)
    r = npusnap("checkpoint", chain.w.pid, "-D", tmp_path / "failed", "--leave-running", "--parent",
                chain.links[0], env={**chain.env, "NPUSNAP_TEST_FAIL": "after:dump"},
                timeout=120)
    assert r.returncode == 3 and "injected" in r.stderr and not (tmp_path / "failed").exists(), r.stderr
    chain.step(1)
    chain.checkpoint()  # against ck0: holds steps 0 and 1
    chain.finish()
    r = chain.restore(chain.links[1])
    assert r.returncode == 0, r.stderr
    chain.w.wait_exit(timeout=60)
    assert strip_ready(chain.w.lines()) == ref


@pytest.mark.parametrize("point,extra", [("after:backup", ()), ("after:dump", ()),
                                         ("after:dump", ("--compress", "zstd"))])
def test_cli_killed_mid_incremental_checkpoint_brings_the_device_back_through_the_chain(
        chain, reference, point, extra) -> None:  # type: ignore[no-untyped-def]
    """Killed once its device data lives only in the staged incremental images: the guardian's
    recover imports them with their parent chain, and the workload runs on bit-exact (with
    --compress, from the images staged in memory, /dev/shm)."""
    from tests.faults.support import PausedCli, wait_recovers

    ref = reference(_argv("-"))
    chain.checkpoint()
    chain.step(0)
    cli = PausedCli(["checkpoint", chain.w.pid, "-D", chain.tmp / "killed", "--leave-running",
                     "--parent", chain.links[0], *extra], point, chain.env)
    cli.kill()
    wait_recovers(chain.w, bound=30, env=chain.env)
    assert not (chain.tmp / "killed").exists()
    chain.finish()
    assert strip_ready(chain.w.lines()) == ref


@pytest.mark.parametrize("codec", ["zstd", "auto"])
def test_compressed_chain_restores_exactly_and_a_damaged_chunk_is_caught(npusim_daemon, reference,  # type: ignore[no-untyped-def]
                                                                         tmp_path, codec) -> None:
    """--compress on device images: training state (bf16-precision floats) compressed into the
    chunk store, a --parent link against a compressed parent, --leave-running's import back
    from memory (every later step's digest covers all device memory), the second link restored
    bit-exact through both; a flipped byte in a chunk of the parent's device image is caught.
    auto: whatever it chose on this machine (compressed chunks, or plain files once it found
    compressing does not pay), the same holds."""
    ref = reference(_argv("-", "floats"))
    c = Chain(tmp_path, npusim_daemon.env, "floats")
    try:
        c.checkpoint("--compress", codec)
        c.step(0)
        c.checkpoint("--compress", codec)
        c.finish()
        assert strip_ready(c.w.lines()) == ref
        ck0, ck1 = c.links
        dev = [json.loads(npusnap("inspect", ck, "--json", check=True).stdout)["device_images"] for ck in c.links]
        plain = {d.get("plain_bytes", 0) > 0 for d in dev}
        assert codec == "auto" or plain == {False}, dev
        if codec == "zstd":
            assert not list((ck0 / "device").iterdir())  # the device images live in the store only
            assert dev[0]["raw_bytes"] >= 64 * MiB and dev[0]["raw_bytes"] >= 1.5 * dev[0]["new_bytes"], dev[0]
            assert dev[1]["raw_bytes"] <= 0.15 * dev[0]["raw_bytes"], dev  # only what changed, then compressed
        assert "device images in the chunk store" in npusnap("inspect", ck1, check=True).stdout
        assert npusnap("verify", ck1).returncode == 0

        r = c.restore(ck1)
        assert r.returncode == 0, r.stderr
        c.w.wait_exit(timeout=60)
        assert strip_ready(c.w.lines()) == ref

        # Allocation 2, chunk 8 (only ever written at the start): ck1 references it in ck0.
        entry = next(f for f in yaml.safe_load((ck0 / "manifest.yaml").read_text())["files"]
                     if f["path"] == "device/dev0.img")
        if entry.get("chunks"):
            digest, stored_as = entry["chunks"][1 + 40].split()[:2]
            damaged, offset, stored = chunk_place(tmp_path / ".npusnap-store", digest, stored_as)
            at = offset + stored // 2
        else:  # auto left it a plain file
            damaged, at = ck0 / "device" / "dev0.img", 64 + 40 * MiB + 123
        data = bytearray(damaged.read_bytes())
        data[at] ^= 0x01
        damaged.write_bytes(bytes(data))
        v = npusnap("verify", ck1)
        assert v.returncode == 8 and "ck0" in v.stderr and "dev0.img" in v.stderr, v.stderr
        r = c.restore(ck1)
        assert r.returncode == 8 and "ck0" in r.stderr and "dev0.img" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
    finally:
        c.w.stop()


def test_a_set_chain_with_compressed_links_restores_exactly(npusim_daemon, reference,  # type: ignore[no-untyped-def]
                                                            tmp_path) -> None:
    """A process set (as a job's node runs its ranks): --compress and --parent for every member,
    each member's images referencing its own in the parent set; the second link restores every
    member bit-exact."""
    ref = reference(_argv("-", "floats"))
    chains = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            chains.append(Chain(tmp_path / name, npusim_daemon.env, "floats"))
        pids = [c.w.pid for c in chains]
        s0, s1 = tmp_path / "s0", tmp_path / "s1"
        base = ["checkpoint", *pids, "--leave-running", "--data-path", "direct", "--compress", "zstd"]
        npusnap(*base, "-D", s0, env=npusim_daemon.env, timeout=180, check=True)
        for c in chains:
            c.step(0)
        npusnap(*base, "-D", s1, "--parent", s0, env=npusim_daemon.env, timeout=180, check=True)
        for c in chains:
            c.finish()
            assert strip_ready(c.w.lines()) == ref
        m = yaml.safe_load((s1 / "manifest.yaml").read_text())
        assert m["parent"]["path"] == "../s0"
        assert all(e["device"]["referenced"] == 64 * MiB - 7 * MiB for e in m["members"]), m["members"]
        assert all(f.get("chunks") for f in m["files"] if f["path"].startswith("device/"))
        assert npusnap("verify", s1).returncode == 0

        for c in chains:
            rewind_to_checkpoint(s1, c.w.out, member=c.w.pid)
        r = npusnap("restore", s1, env=npusim_daemon.env, timeout=180)
        assert r.returncode == 0, r.stderr
        for c in chains:
            assert strip_ready(c.w.lines()) == ref
    finally:
        for c in chains:
            c.w.stop()
