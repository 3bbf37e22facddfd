"""Ctrl-C (or SIGTERM) at random instants of `npusnap job checkpoint --leave-running` (and
`--live`) on the real test cluster: whenever the signal lands, the command reports what happened, one line and no
traceback: exit 0 and a committed job checkpoint that verifies, or exit 130 and nothing at all
(no checkpoint, no staging directory left; a SIGTERM before the command began: killed by it,
and nothing either); no worker is left and every rank runs on. The
workers' step runs in a session of its own (as a terminal's Ctrl-C would not reach it), so the
signal goes to the coordinator alone. NPUSNAP_JOB_SIGINT trials each (the seed is printed)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid

import pytest

from .support import RankJob, as_json, coordinator, npusnap
from .test_faults import no_workers_left

TRIALS = int(os.environ.get("NPUSNAP_JOB_SIGINT", "3"))
INTERRUPTED = 130


@pytest.mark.parametrize("extra", [["--leave-running"], ["--live"]], ids=["leave-running", "live"])
def test_ctrl_c_at_random_instants_of_a_job_checkpoint(ranks: RankJob, extra: list[str]) -> None:
    c = ranks.c
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    started = time.monotonic()  # one uninterrupted run times the command: the signals land within it
    as_json(npusnap(c, "job", "checkpoint", "-D", str(c.shared / f"ck-int-{uuid.uuid4().hex[:8]}"), "--job",
                    ranks.id, *extra, "--json"))
    whole = time.monotonic() - started
    for trial in range(TRIALS):
        target = c.shared / f"ck-int-{uuid.uuid4().hex[:8]}"
        delay = rng.uniform(0.0, whole * 1.1)
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        proc = coordinator(c, target, ranks.id, {}, *extra)
        try:
            time.sleep(delay)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        where = f"seed {seed}, trial {trial}, {sig.name} after {delay:.3f} s of {whole:.3f} s: exit {proc.returncode}\n{err}"
        # SIGTERM before the command's handlers are in place (its first ~50 ms) kills it as it would
        # any program: nothing was begun, which the checks below see.
        killed = proc.returncode == -signal.SIGTERM
        assert "Traceback" not in err and (proc.returncode in (0, INTERRUPTED) or killed), where
        errors = [line for line in err.splitlines() if line.startswith("npusnap: error: ")]
        no_workers_left(c)
        status = json.loads(npusnap(c, "job", "status", str(target), "--json").stdout)
        if proc.returncode == 0:
            assert not errors and status["state"] == "committed", (status, where)
            assert as_json(npusnap(c, "job", "verify", str(target), "--json"))["valid"] is True, where
        else:
            assert killed or (len(errors) == 1 and "interrupted" in errors[0]), where
            assert status["state"] == "absent" and not status["partial"], (status, where)
            assert not list(c.shared.glob(f".{target.name}.*")), where  # nor its rendezvous directory
        ranks.assert_all_run_on(timeout=90)
