"""examples/ddp/: the data-parallel training example, N ranks joined by HCCL, launched the torchrun
way by launch.sh, checkpointed as one set while its all-reduces run, killed, the daemon restarted,
restored: every rank's losses and weights bit-identical to an uninterrupted run."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import NpuSimDaemon
from tests.helpers import npusnap, requires_criu

from .support import EXAMPLES, new_marker, read_lines, reap_marked, script_env, strip_pid, wait_for_line

LAUNCH = EXAMPLES / "ddp" / "launch.sh"
STEPS = 40


def launch(env: dict[str, str], ranks: int, out: Path, sleep_ms: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", str(LAUNCH), str(ranks), "-o", str(out), "--", "--steps", str(STEPS),
                             "--sleep-ms", str(sleep_ms)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rank_lines(out: Path, ranks: int) -> list[list[str]]:
    return [strip_pid(read_lines(out / f"rank-{r}.out")) for r in range(ranks)]


@requires_criu
@pytest.mark.criu
@pytest.mark.parametrize("ranks", [2, 4])
def test_all_ranks_checkpointed_mid_run_restore_bit_identical(tmp_path: Path, ranks: int) -> None:
    marker = new_marker()
    with tempfile.TemporaryDirectory(prefix="ddp-", dir="/tmp") as short:   # a socket path fits sun_path
        daemon = NpuSimDaemon(socket=f"{short}/npusim.sock", devices=4)
        launcher = None
        try:
            with daemon.running():
                env = script_env(daemon.env, marker)
                ref = launch(env, ranks, tmp_path / "ref", 0)
                assert ref.wait(timeout=180) == 0, rank_lines(tmp_path / "ref", ranks)
                expected = rank_lines(tmp_path / "ref", ranks)
                assert all(lines == expected[0] for lines in expected), "ranks disagree on the weights"
                assert len(expected[0]) == STEPS + 1

                out = tmp_path / "run"
                gate = tmp_path / "gate"  # the ranks hold before their end until the restore
                launcher = launch({**env, "STEP_GATE": f"{STEPS - 2}:{gate}"}, ranks, out, 100)
                for r in range(ranks):
                    wait_for_line(out / f"rank-{r}.out", "step 3 ", timeout=120, alive=launcher)
                pids = (out / "pids").read_text().split()
                ckpt = tmp_path / "ckpt"
                r = npusnap("checkpoint", *pids, "-D", ckpt, timeout=240)
                assert r.returncode == 0, r.stderr
                launcher.wait(timeout=60)            # its ranks are gone: checkpointed, then killed
                assert all(len(lines) < STEPS + 1 for lines in rank_lines(out, ranks))

                daemon.restart()                     # nothing of the ranks' device state survives
                gate.touch()
                r = npusnap("restore", ckpt, timeout=240)
                assert r.returncode == 0, r.stderr
                for rank in range(ranks):
                    wait_for_line(out / f"rank-{rank}.out", "done weights", timeout=180)
                assert rank_lines(out, ranks) == expected
        finally:
            if launcher is not None and launcher.poll() is None:
                launcher.kill()
                launcher.wait()
            reap_marked(marker)
