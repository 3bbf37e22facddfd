"""A kernel runs with no more rights than the process that loaded it. npusimd runs as root, but a
kernel launched by an unprivileged member of the device group runs in a kernel runner with that
user's uid, gid and groups: it cannot write a file the user could not write. Root's own launch of
the same kernel can, which shows the kernel really ran."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

from tests.users import device_user, run_as


def _stage(scratch: Path, toolkit_home: Path, cann_program, kernels_so) -> tuple[Path, Path]:
    """The program, its runtime and the device binary, where the other user can read them."""
    exe = scratch / "whoami"
    shutil.copy(cann_program("whoami.c", "-lascendcl", f"-Wl,-rpath,{scratch}"), exe)
    shutil.copy(toolkit_home / "lib64" / "libascendcl.so", scratch / "libascendcl.so")
    binary = scratch / "kernels.so"
    shutil.copy(kernels_so, binary)
    for p in (exe, scratch / "libascendcl.so", binary):
        os.chmod(p, 0o755)
    return exe, binary


def test_kernel_of_a_group_member_cannot_write_a_root_file(group_daemon, scratch, toolkit_home, cann_program,
                                                          kernels_so) -> None:
    exe, binary = _stage(scratch, toolkit_home, cann_program, kernels_so)
    victim = scratch / "victim"
    victim.write_text("root's\n")
    os.chmod(victim, 0o644)

    alice = device_user()
    r = run_as(alice, [str(exe), str(binary), str(victim)], env={"NPUSIM_SOCKET": group_daemon.socket})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["uid", str(alice.uid), "gid", str(alice.gid), "opened", "0",
                                "errno", str(errno.EACCES)]
    assert victim.read_text() == "root's\n"

    # The same kernel launched by root writes it: the refusal above is the user's rights, not a bug.
    r = subprocess.run([str(exe), str(binary), str(victim)], env={**os.environ, "NPUSIM_SOCKET": group_daemon.socket},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[:6] == ["uid", "0", "gid", "0", "opened", "1"]
    assert victim.read_text() == "root's\nwritten by a kernel\n"
