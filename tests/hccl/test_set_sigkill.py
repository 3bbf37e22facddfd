"""SIGKILL of npusnap at random instants of a set checkpoint and of a set restore of examples/ddp's
HCCL ranks (launched by launch.sh, the torchrun way). With npusnap dead, only its guardian and the
agents' leases are left to finish the job, and they must end it in one of the outcomes npusnap
itself would have reported:

  * killed before the commit (the directory's rename): rolled back, every rank running, unlocked,
    its communicators re-formed together with its peers' (or never left), no valid checkpoint;
  * killed after the commit: committed, the set verifies, every rank killed (or, --leave-running,
    every rank running on, its device back from the committed images);
  * a restore killed before its last unlock: no rank left, the checkpoint intact for a retry;
    after it: every rank running.

Then the ranks train on to their end: every rank's losses and weight digests, step by step, are an
uninterrupted run's. 2 ranks and 4; the seed is printed (NPUSNAP_FAULT_SEED replays it) and
`make faults` runs more (NPUSNAP_FAULT_SET_SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.conftest import NpuSimDaemon
from tests.examples.support import read_lines, reap_marked, script_env, strip_pid, wait_for_line
from tests.examples.test_ddp import LAUNCH
from tests.faults.support import PausedCli, assert_no_valid_checkpoint
from tests.faults.test_random_faults import SEED, tagged
from tests.helpers import agent_status, npusnap, pid_alive, proc_state, requires_criu, rewind_to_checkpoint

pytestmark = [requires_criu, pytest.mark.criu]

KILLS = int(os.environ.get("NPUSNAP_FAULT_SET_SIGKILL") or 8)  # trials for 2 ranks; half for 4
STEPS = 600  # the gate holds the ranks before their last steps until the trials are over
SLEEP_MS = 20
SETTLE_S = 120  # bound on the guardian's work after a kill (a rank's rejoin waits up to 30 s)
# (data path, --leave-running) per checkpoint trial, in turn
MODES = [("in-process", False), ("direct", False), ("direct", True), ("in-process", True)]


def launch(env: dict[str, str], ranks: int, out: Path, steps: int, sleep_ms: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", str(LAUNCH), str(ranks), "-o", str(out), "--", "--steps", str(steps),
                             "--sleep-ms", str(sleep_ms)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@dataclass
class Ranks:
    env: dict[str, str]  # the ranks' (their daemon's, marked and tagged)
    cli_env: dict[str, str]  # npusnap's: its TMPDIR is meet
    meet: Path  # where a set's rendezvous directory is made
    out: Path  # the ranks' output
    launcher: subprocess.Popen[bytes]
    pids: list[int]
    tag: str  # on every process of npusnap's (tagged())


@contextlib.contextmanager
def ddp_ranks(tmp_path: Path, n: int, launch_env: Optional[dict[str, str]] = None) -> Iterator[Ranks]:
    """n ranks of examples/ddp on a daemon of their own, each past its third step; after, the
    launcher, the ranks and whatever of npusnap's is left are killed and reaped."""
    marker, tag = uuid.uuid4().hex, uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="ddp-", dir="/tmp") as short:  # socket paths fit sun_path
        daemon = NpuSimDaemon(socket=f"{short}/npusim.sock", devices=4)
        launcher = None
        try:
            with daemon.running():
                env = script_env(daemon.env, marker, NPUSNAP_TEST_TAG=tag)
                meet = Path(short) / "tmp"
                meet.mkdir(0o700)
                out = tmp_path / "run"
                launcher = launch({**env, **(launch_env or {})}, n, out, STEPS, SLEEP_MS)
                for r in range(n):
                    wait_for_line(out / f"rank-{r}.out", "step 3 ", timeout=120, alive=launcher)
                pids = [int(p) for p in (out / "pids").read_text().split()]
                yield Ranks(env, {**env, "TMPDIR": str(meet)}, meet, out, launcher, pids, tag)
        finally:
            if launcher is not None and launcher.poll() is None:
                launcher.kill()
                launcher.wait()
            reap_marked(marker)
            for pid in tagged(tag):
                os.kill(pid, signal.SIGKILL)


def steps_of(out: Path, rank: int) -> list[str]:
    return [x for x in read_lines(out / f"rank-{rank}.out") if x.startswith("step ")]


def settle(tag: str, keep: set[int], what: str) -> None:
    """Wait until nothing of ours but the ranks and their launcher is left: the guardian, the
    recoveries it started, CRIU. And no process of ours is left stopped."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = tagged(tag)
        stray = {p: s for p, s in found.items() if p not in keep}
        stopped = {p: s for p, s in found.items() if s[0] in ("T", "t")}
        if not stray and not stopped:
            return
        assert time.monotonic() < deadline, f"{what}: after {SETTLE_S} s: stray {stray}, stopped {stopped}"
        time.sleep(0.1)


def assert_all_run_on(out: Path, pids: list[int], env: dict[str, str], gate_step: int, what: str) -> None:
    """Every rank alive, not stopped, unlocked, and training on (three more steps each, every one
    an AllReduce with every peer: a communicator left broken fails or hangs them) unless it is
    already held at the gate."""
    for pid in pids:
        assert proc_state(pid) not in ("T", "t", "Z", "gone"), (what, pid, proc_state(pid))
        state = agent_status(pid, env)["state"]
        assert state == "RUNNING", (what, pid, state)
    for rank, pid in enumerate(pids):
        mark = len(steps_of(out, rank))
        want = min(mark + 3, gate_step + 1)
        deadline = time.monotonic() + 60
        while len(steps_of(out, rank)) < want:
            assert pid_alive(pid), (what, f"rank {rank} died", read_lines(out / f"rank-{rank}.out")[-5:])
            assert time.monotonic() < deadline, (what, f"rank {rank} did not train on", steps_of(out, rank)[-2:])
            time.sleep(0.05)


def wait_all_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, (what, {p: proc_state(p) for p in pids})
        time.sleep(0.05)


def sigkill_after(args: list[object], point: str, delay: Optional[float], env: dict[str, str]) -> tuple[bool, str]:
    """`npusnap ARGS` SIGKILLed delay seconds after it passed point (NPUSNAP_TEST_PAUSE with no
    pause: it only announces the point), or None: at the point (paused there); whether it was
    killed (else it succeeded), and its stderr."""
    cli = PausedCli(args, point, {**env, "NPUSNAP_TEST_PAUSE_S": "60" if delay is None else "0"}, timeout=180)
    delay = delay or 0.0
    try:
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and cli.proc.poll() is None:
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
        killed = cli.proc.poll() is None
        if killed:
            cli.proc.kill()
        _, err = cli.proc.communicate(timeout=240)
    finally:
        if cli.proc.poll() is None:
            cli.kill()
    assert killed or cli.proc.returncode == 0, (args, point, cli.proc.returncode, cli.stderr + err.decode())
    return killed, cli.stderr + err.decode()


@pytest.mark.parametrize("n", [2, 4])
def test_sigkill_at_random_instants_of_a_set_checkpoint_and_restore(n: int, tmp_path: Path) -> None:
    trials = KILLS if n == 2 else max(1, KILLS // 2)
    gate_step = STEPS - 2
    rng = random.Random(f"{SEED}:setkill:{n}")
    outcomes: list[str] = []
    gate = tmp_path / "gate"
    with ddp_ranks(tmp_path, n, {"STEP_GATE": f"{gate_step}:{gate}"}) as ranks:
        env, cli_env, meet, out, pids, tag = ranks.env, ranks.cli_env, ranks.meet, ranks.out, ranks.pids, ranks.tag
        keep = {ranks.launcher.pid, *pids}
        running, ready = True, None  # ready: the committed checkpoint while the ranks are gone
        # where the kill lands: at a random instant shortly after one of these points, in turn
        checkpoint_points = [f"after:backup@{pids[0]}", "commit", f"after:dump@{pids[0]}", f"after:lock@{pids[0]}",
                             f"before:dump@{pids[0]}", "after:seal", f"before:backup@{pids[-1]}"]
        restore_points = [f"after:criu-restore@{pids[0]}", f"before:device-restore@{pids[0]}",
                          "before:unlock", f"after:criu-restore@{pids[-1]}"]
        counts = {"checkpoint": 0, "restore": 0}
        for i in range(trials):
            op = "checkpoint" if running else "restore"
            data_path, leave = MODES[counts["checkpoint"] % len(MODES)]
            if running:
                target = tmp_path / f"ck{i}"
                args: list[object] = ["checkpoint", *pids, "-D", target, "--data-path", data_path,
                                      *(["--leave-running"] if leave else [])]
                point = checkpoint_points[counts[op] % len(checkpoint_points)]
            else:
                assert ready is not None
                target = ready
                for r, pid in enumerate(pids):  # a killed restore's ranks may have written on
                    rewind_to_checkpoint(ready, out / f"rank-{r}.out", member=pid)
                args = ["restore", "--detach", target]
                point = restore_points[counts[op] % len(restore_points)]
            counts[op] += 1
            # at the point itself, or at a random instant after it (mostly soon: the windows are short)
            delay = None if rng.random() < 0.5 else 0.4 * rng.random() ** 2
            when = "at" if delay is None else f"{delay:.3f} s after"
            what = f"seed {SEED} trial {i}: {' '.join(map(str, args[:1] + args[-3:]))}, SIGKILL {when} {point}"
            killed, _ = sigkill_after(args, point, delay, cli_env)
            settle(tag, keep, what)
            assert not list(meet.glob("npusnap-hccl-*")), (what, "the set's rendezvous directory is left")
            if op == "checkpoint":
                committed = (target / "manifest.yaml").exists()
                if committed:
                    npusnap("verify", target, check=True, timeout=120)
                else:
                    assert_no_valid_checkpoint(target, partial_ok=False)
                if committed and not leave:  # the ranks are the checkpoint now
                    wait_all_gone(pids, what)
                    running, ready = False, target
                else:
                    assert_all_run_on(out, pids, cli_env, gate_step, what)
                outcome = "committed" if committed else "rolled back"
            else:
                alive = [pid_alive(p) for p in pids]
                assert all(alive) or not any(alive), (what, "some ranks restored, others not", alive)
                if all(alive):
                    assert_all_run_on(out, pids, cli_env, gate_step, what)
                    running, ready = True, None
                else:
                    npusnap("verify", target, check=True, timeout=120)
                outcome = "restored" if all(alive) else "none restored"
            outcomes.append(f"{op} {'killed' if killed else 'finished'} {when} {point}: {outcome}")
        print(f"set SIGKILL trials (seed {SEED}, {n} ranks): {'; '.join(outcomes)}")
        if not running:  # the last trial left the set checkpointed: brought back to finish
            assert ready is not None
            for r, pid in enumerate(pids):
                rewind_to_checkpoint(ready, out / f"rank-{r}.out", member=pid)
            npusnap("restore", "--detach", ready, env=cli_env, check=True, timeout=240)
        gate.touch()
        for r in range(n):
            wait_for_line(out / f"rank-{r}.out", "done weights", timeout=240)
        got = [strip_pid(read_lines(out / f"rank-{r}.out")) for r in range(n)]
        ref = launch(env, n, tmp_path / "ref", STEPS, 0)  # the same training, uninterrupted
        assert ref.wait(timeout=300) == 0
        expected = strip_pid(read_lines(tmp_path / "ref" / "rank-0.out"))
        assert len(expected) == STEPS + 1
        for r in range(n):
            assert got[r] == expected, (f"seed {SEED}: rank {r}",
                                        next((a, b) for a, b in zip(got[r], expected) if a != b)
                                        if len(got[r]) == len(expected) else len(got[r]))


def test_a_restore_killed_while_its_ranks_reform_restores_again_at_once(tmp_path: Path) -> None:
    """A set restore SIGKILLed while its first ranks wait in the daemon for the last to re-form
    their communicator, then restored again at once: it succeeds. Before, the dead ranks' joins
    waited on in npusimd for HCCL_CONNECT_TIMEOUT (120 s), holding the communicator (under its old
    secret) and their Sessions (which the restored processes, at the same pids, took over): the
    second restore failed after that timeout with the runtime's restore error (507909)."""
    with ddp_ranks(tmp_path, 2) as ranks:
        cli_env, meet, out, pids, tag = ranks.cli_env, ranks.meet, ranks.out, ranks.pids, ranks.tag
        target = tmp_path / "ck"
        npusnap("checkpoint", *pids, "-D", target, "--data-path", "direct", env=cli_env, check=True,
                timeout=240)
        wait_all_gone(pids, "checkpoint")
        for r, pid in enumerate(pids):
            rewind_to_checkpoint(target, out / f"rank-{r}.out", member=pid)
        # the last rank held before its device restore: rank 0 registers, publishes and waits for it
        cli = PausedCli(["restore", "--detach", target], f"before:device-restore@{pids[-1]}",
                        {**cli_env, "NPUSNAP_TEST_PAUSE_S": "60"}, timeout=180)
        try:
            deadline = time.monotonic() + 60
            while not list(meet.glob("npusnap-hccl-*/hccl-*.root")):
                assert time.monotonic() < deadline, "rank 0 never published its communicator"
                time.sleep(0.05)
            time.sleep(0.5)  # rank 0's join is in the daemon
        finally:
            cli.kill()
        settle(tag, {ranks.launcher.pid}, "the killed restore")
        wait_all_gone(pids, "the killed restore")
        for r, pid in enumerate(pids):
            rewind_to_checkpoint(target, out / f"rank-{r}.out", member=pid)
        npusnap("restore", "--detach", target, env=cli_env, check=True, timeout=240)
        assert_all_run_on(out, pids, cli_env, STEPS, "the restore after")
