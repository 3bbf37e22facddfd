"""The checkpoint test the step programs of tests/cann share: an uninterrupted run's output, then
the same program under `npusnap run`, checkpointed mid-run (the process dies), the daemon
restarted, the checkpoint restored; the restored run's output must equal the uninterrupted one."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import StepGate, Workload, npusnap, npusnap_cmd
from tests.pipeline.support import strip_ready as output  # less the pid: a restore keeps it, a second run does not


def reference(daemon, exe: Path, steps: int) -> list[str]:
    r = subprocess.run([str(exe), str(steps), "0"], env=daemon.env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return output(r.stdout.splitlines())


def checkpoint_mid_run(daemon, exe: Path, steps: int, sleep_ms: int, after: str, expected: list[str],
                       tmp_path: Path) -> None:
    """Checkpoints exe once it printed a line starting with after (held before its last step until
    then); asserts the restored output."""
    gate = StepGate(tmp_path / "gate", steps - 2)
    w = Workload([*npusnap_cmd(), "run", "--", str(exe), str(steps), str(sleep_ms)], tmp_path / "out",
                 env={**daemon.env, **gate.env})
    try:
        w.wait_for_line(after, timeout=30)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, env=daemon.env, timeout=120)
        assert r.returncode == 0, r.stderr
        at_checkpoint = output(w.lines())
        assert at_checkpoint == expected[: len(at_checkpoint)] and len(at_checkpoint) < len(expected)
        w.wait_exit(timeout=10)

        daemon.restart()  # nothing of the process is left on the device
        gate.open()
        rs = npusnap("restore", ck, env=daemon.env, timeout=120)
        assert rs.returncode == 0, f"{rs.stderr}\n{w.lines()[-3:]}"
        w.wait_for_line("done", timeout=60)
        assert output(w.lines()) == expected
    finally:
        w.stop()
