"""Sharing between processes on one daemon (tests/cann/ipc_share.c): IPC memory by key, physical
memory by shareable handle, IPC notifies and IPC events, with CANN's pid whitelist; and a
checkpoint of the exporter while its importer runs is refused (ACL_ERROR_SNAPSHOT_LOCK_FAILED),
the processes running on. (Checkpointing both, importer first: test_ipc_carry.py.)"""

from __future__ import annotations

import os
import re

from tests.helpers import Workload, npusnap, npusnap_cmd, pid_alive

EXPECTED = sorted([
    "A key too short 100000",  # ACL_ERROR_INVALID_PARAM: the buffer cannot hold the key
    "A ipc memory written by B ok",
    "A physical memory written by B ok",
    "B ipc memory read ok",
    "B physical memory read ok",
    "B notify from A seen",
    "B read after A's event 321",  # B's stream waited for A's IPC event
    "B closed 100000",  # closing a key twice
    "C import by key 207006",  # ACL_ERROR_RT_NO_PERMISSION: C is not whitelisted
    "C import shareable 207006",
    "C import notify 207006",
    "C open key read ok",  # exported with pid validation disabled
    "A lock 507906",  # the program's own aclrtSnapShotProcessLock, refused the same way
    "B lock 0",  # an importer may be checkpointed
    "B unlock 0",
    "A done",
])


def test_sharing_works_and_a_checkpoint_of_either_side_is_refused(npusim_daemon, build_c, tmp_path) -> None:
    exe = build_c("ipc_share")
    release = tmp_path / "release"
    for name in ("a2b", "b2a", "a2c", "c2a"):
        os.mkfifo(tmp_path / name)
    env = npusim_daemon.env
    sides = {role: Workload([*npusnap_cmd(), "run", "--", str(exe), role, str(tmp_path), str(release)],
                            tmp_path / f"{role}.out", env=env) for role in "abc"}
    try:
        sides["a"].wait_for_line("A holding", timeout=60)
        sides["b"].wait_for_line("B holding", timeout=30)
        pid, target = sides["a"].pid, tmp_path / "ck-exporter"
        r = npusnap("checkpoint", pid, "-D", target, env=npusim_daemon.env, timeout=120)
        assert r.returncode == 9, f"exit {r.returncode}: {r.stderr}"  # the device lock failed
        errors = [x for x in r.stderr.splitlines() if x.startswith("npusnap: error:")]
        assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "507906" in errors[0], r.stderr  # ACL_ERROR_SNAPSHOT_LOCK_FAILED
        assert not target.exists()
        assert pid_alive(pid)
        release.touch()
        for w in sides.values():
            assert w.proc.wait(timeout=60) == 0, w.lines()[-5:]
        got = sorted(x for w in sides.values() for x in w.lines() if not re.fullmatch(r"[AB] holding pid \d+", x))
        assert got == EXPECTED
    finally:
        for w in sides.values():
            w.stop()
