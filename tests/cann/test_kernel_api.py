"""The kernel-binary API (aclrtBinary*, aclrtLaunchKernel*, aclrtKernelArgs*) on a real daemon:
a device binary built for the host really runs, blocks in parallel, on the caller's memory."""

from __future__ import annotations

import subprocess
import time


def test_every_binary_and_launch_call(npusim_daemon, cann_program, kernels_so) -> None:
    exe = cann_program("kernel_api.c", "-lascendcl")
    r = subprocess.run([str(exe), str(kernels_so)], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["ok load", "ok function", "ok launch", "ok gm", "ok args", "ok user memory",
                                     "ok unload", "done"]


def test_runner_ends_with_the_session(npusim_daemon, cann_program, kernels_so) -> None:
    """The kernel runner is the daemon's child for one client: gone (reaped) once the client is."""
    exe = cann_program("kernel_api.c", "-lascendcl")
    subprocess.run([str(exe), str(kernels_so)], env=npusim_daemon.env, capture_output=True, timeout=60,
                   stdin=subprocess.DEVNULL, check=True)
    assert npusim_daemon.proc is not None

    def children() -> list[str]:
        out = subprocess.run(["ps", "-o", "pid=,stat=,comm=", "--ppid", str(npusim_daemon.proc.pid)],
                             capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line.strip()]

    deadline = time.monotonic() + 10  # the daemon notices the client's exit on its own thread
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() == []


def test_model_run_instances(npusim_daemon, cann_program, kernels_so) -> None:
    exe = cann_program("model_ri.c", "-lascendcl", "-lnnopbase", "-lopapi")
    r = subprocess.run([str(exe), str(kernels_so)], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["ok capture", "ok execute", "ok kernel in a model", "ok built model",
                                     "ok task group update", "ok conditions", "done"]


def test_a_crashing_kernel_fails_its_launch_only(npusim_daemon, cann_program, kernels_so) -> None:
    exe = cann_program("kernel_crash.c", "-lascendcl")
    r = subprocess.run([str(exe), str(kernels_so)], env=npusim_daemon.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["ok crash reported", "ok device goes on", "done"]
    assert npusim_daemon.proc is not None and npusim_daemon.proc.poll() is None  # the daemon lives on
