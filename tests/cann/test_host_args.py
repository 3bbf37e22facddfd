"""aclrtLaunchKernelWithHostArgs (tests/cann/host_args.c): placeholders get the device address of
their data, copied at the call (the caller's buffer may change right after), bad placeholders and
zero blocks are refused; a kernel writes registered host memory in place through its device pointer."""

from __future__ import annotations

import subprocess


def test_launch_with_host_args(npusim_daemon, cann_program, kernels_so) -> None:
    exe = cann_program("host_args.c", "-lascendcl")
    r = subprocess.run([str(exe), str(kernels_so)], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "placeholder 7 1999",        # 2x + 1: the data as it was at the call
        "placeholder again 2 -994",  # -x + 5: the changed buffer, copied at the second call
        "errors outside 100000 blocks 100000",
        "zero copy 14 1998",         # x + x, written by the kernel into host memory
        "done",
    ]
