"""Every hook that exists for the test suite, in one place; none changes what a user sees
unless its environment variable is set.

* NPUSNAP_TEST_PAUSE=before:PHASE|after:PHASE|commit|pack|device-unlock (NPUSNAP_TEST_PAUSE_S): the
  checkpoint pipeline announces the point on stderr and waits there for a signal (tests/faults,
  pipeline; pack: the chunk store's pack of this run made and its first chunk in it, not yet
  indexed; device-unlock: each agent unlock, as --leave-running's after the commit, the device's
  data back),
  or until the file NPUSNAP_TEST_PAUSE_UNTIL exists (tests/pipeline/test_live.py). Several
  points, comma-separated: a pause at each (two nodes' workers held, tests/job/test_hccl_abort.py).
* NPUSNAP_TEST_FAIL=before:PHASE|after:PHASE (a set member's: before:PHASE@PID): the pipeline
  fails there with an injected error, as if that phase had failed (tests/processset);
  during:write-behind fails a --live checkpoint's copy to disk after its first file.
  after:export@PID: the direct path's device files written, the process not yet backed up.
* NPUSNAP_TEST_JOB_FAIL=POINT@NODE / NPUSNAP_TEST_JOB_PAUSE=POINT@NODE: a job worker on NODE
  fails (or announces the point and waits, as above) at POINT: lock (before its set starts),
  vote, committed, done (after the job's commit, before its ranks run on or are killed),
  restore (tests/job).
* NPUSNAP_TEST_DISK_MBPS=N: the checkpoint's disk is made N MB/s slow (bench.devicecompress's
  slow sink; this machine has no throttled block device): see disk().
* NPUSNAP_LIBCUDA naming the CUDA test shim (native/cudashim): `--device auto` recognises a
  process driven by the shim as a CUDA process (real ones are found by /dev/nvidia* mappings).

NPUSIM_CTL_FAULT (fault injection in npusim's by-pid control listener) and
NPUSIM_TEST_HCCL_LEAVE_MS (npusimd notices a rank's closed HCCL connection that late, as on a
loaded host) are read by the native code only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional

from .errors import NpusnapError


def pause(point: str, until: Callable[[], bool] = lambda: False) -> None:
    """NPUSNAP_TEST_PAUSE=point: announce the point and wait (up to 60 s, or
    NPUSNAP_TEST_PAUSE_S) for a signal; where signals are held, until() ends the wait."""
    if point not in os.environ.get("NPUSNAP_TEST_PAUSE", "").split(","):
        return
    sys.stderr.write(f"npusnap: test pause {point}\n")
    sys.stderr.flush()
    deadline = time.monotonic() + float(os.environ.get("NPUSNAP_TEST_PAUSE_S") or 60)
    done = os.environ.get("NPUSNAP_TEST_PAUSE_UNTIL")
    while time.monotonic() < deadline and not until() and not (done and os.path.exists(done)):
        time.sleep(0.05)


_failed: set[str] = set()


def fail(point: str, once: bool = False) -> None:
    """NPUSNAP_TEST_FAIL=point: raise an injected failure here (once: only the first time, as a
    Ctrl-C lands once, for a point that the rollback passes again)."""
    if os.environ.get("NPUSNAP_TEST_FAIL") == point and not (once and point in _failed):
        _failed.add(point)
        raise NpusnapError(f"test failure injected at {point}")


def job_point(point: str, node: str) -> None:
    """NPUSNAP_TEST_JOB_FAIL / NPUSNAP_TEST_JOB_PAUSE = point@node, in a job worker."""
    here = f"{point}@{node}"
    if os.environ.get("NPUSNAP_TEST_JOB_PAUSE") == here:
        sys.stderr.write(f"npusnap: test pause {here}\n")
        sys.stderr.flush()
        time.sleep(float(os.environ.get("NPUSNAP_TEST_PAUSE_S") or 60))
    if os.environ.get("NPUSNAP_TEST_JOB_FAIL") == here:
        raise NpusnapError(f"test failure injected at {here}")


def shim_cuda_process(pid: int, maps: str) -> bool:
    """--device auto under the CUDA test shim (NPUSNAP_LIBCUDA set to it): a process without the
    agent that maps the runtime the shim names and answers GetState is a CUDA process. A real
    driver is never asked here."""
    if not os.environ.get("NPUSNAP_LIBCUDA"):
        return False
    from .platform.cuda import CudaError, Driver

    try:
        driver = Driver.load()
        if driver.shim_marker is None or driver.shim_marker not in maps:
            return False
        driver.state(pid)
    except (CudaError, NpusnapError):
        return False
    return True


_disk_free = 0.0  # NPUSNAP_TEST_DISK_MBPS: when the slow disk will have written all it was given
_disk_lock = threading.Lock()  # charged from the packing thread too


def disk(nbytes: int = 0, window: Optional[int] = None) -> None:
    """NPUSNAP_TEST_DISK_MBPS=N: every byte written for the checkpoint is charged at N MB/s, as a
    disk with a write-back cache takes them: nbytes are queued behind what is already queued;
    window: then wait until at most window bytes are left (0: all written, as an fsync waits).
    Charged: the direct export (to the disk) and a snapshot's write-out, CRIU's images and the
    device files at the seal's fsync, the chunk store's chunks as they are written (store.Pacer),
    a copied-out image."""
    global _disk_free
    rate = float(os.environ.get("NPUSNAP_TEST_DISK_MBPS") or 0) * 1e6
    if rate <= 0:
        return
    with _disk_lock:
        _disk_free = max(_disk_free, time.monotonic()) + nbytes / rate
        free = _disk_free
    if window is not None:
        left = free - window / rate - time.monotonic()
        if left > 0:
            time.sleep(left)
