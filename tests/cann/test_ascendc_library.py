"""npusim's ascendc.cmake on a CANN-sample-style project of ours (tests/cann/ascendc_demo): AscendC
kernel sources become an npusim device binary (compiled on the host against npusim's
kernel_operator.h, or taken from SOURCE.npusim.cpp), the library's host side launches them through
the generated aclrtlaunch_* headers and the sources' <<<>>> wrappers, a fatbin is installed where
CANN's samples load it, kernels print, a kernel without npusim implementation builds and fails
clearly at launch, and the library's kernels survive a checkpoint and a daemon restart."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import StepGate, Workload, agent_status, requires_criu
from tests.pipeline.support import checkpoint_and_restore_after_daemon_restart, strip_ready, under_agent

HERE = Path(__file__).resolve().parent
STEPS, AT, SLEEP_MS = 30, 4, 20


@dataclass
class Demo:
    root: Path
    configure_log: str

    @property
    def exe(self) -> Path:
        return self.root / "build" / "demo"  # the build tree's binary: rpath to the toolkit's lib64

    @property
    def fatbin(self) -> Path:
        return self.root / "out" / "fatbin" / "demo_fatbin" / "demo_fatbin.o"


@pytest.fixture(scope="module")
def demo(device_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """The project configured, built and installed as a sample's run.sh does, with nothing but the
    variables of `npusnap device env` and ASCENDC_CMAKE_DIR."""
    if not shutil.which("cmake"):
        pytest.skip("cmake is required")
    root = tmp_path_factory.mktemp("ascendc") / "demo"
    shutil.copytree(HERE / "ascendc_demo", root)
    home = device_env["ASCEND_TOOLKIT_HOME"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **device_env,
           "ASCENDC_CMAKE_DIR": f"{home}/tikcpp/ascendc_kernel_cmake"}
    steps = [["cmake", "-B", "build", f"-DASCEND_CANN_PACKAGE_PATH={home}"], ["cmake", "--build", "build", "-j2"],
             ["cmake", "--install", "build"]]
    logs = []
    for argv in steps:
        r = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"{argv}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
        logs.append(r.stderr)
    return Demo(root, logs[0])


def run(demo: Demo, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(demo.exe), *args], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_launch_header_is_generated_from_the_kernel_signature(demo) -> None:
    header = (demo.root / "build" / "npusim_ascendc" / "demo_kernels" / "include" / "aclrtlaunch_scale_add.h").read_text()
    assert ("uint32_t aclrtlaunch_scale_add(uint32_t blockDim, aclrtStream stream, void * x, void * y, void * z, "
            "float alpha, uint32_t n);") in header
    assert "#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func" in header


def test_configure_names_only_the_kernel_without_npusim_implementation(demo) -> None:
    warning = " ".join(demo.configure_log.split())
    assert "kernel(s) missing_kernel do not compile against npusim's AscendC emulation" in warning
    assert "missing.npusim.cpp provides them" in warning
    assert "scale_add" not in warning and "blend" not in warning and "greet" not in warning


def test_kernels_of_all_three_paths_compute_what_the_host_computes(demo, npusim_daemon) -> None:
    r = run(demo, npusim_daemon.env, "steps", "3", "0", str(demo.fatbin))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = strip_ready(r.stdout.splitlines())
    assert [line.split()[-1] for line in lines[:3]] == ["match"] * 3 and lines[3:] == ["done"], lines


def test_kernel_printf_reaches_stdout_once_the_kernel_ran(demo, npusim_daemon) -> None:
    r = run(demo, npusim_daemon.env, "print")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "before" and lines[-1] == "after", lines
    assert sorted(lines[1:-1]) == [f"greet 7 from block {b} of 4" for b in range(4)]


def test_kernel_without_npusim_implementation_fails_with_a_clear_message(demo, npusim_daemon) -> None:
    r = run(demo, npusim_daemon.env, "missing")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rc 207000" in r.stdout  # ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    message = r.stdout.split("message ", 1)[1]
    assert "missing_kernel" in message and "demo_kernels" in message and "npusim/kernel.h" in message
    assert "NPUSIM_KERNEL_SOURCES_demo_kernels" in message


@requires_criu
@pytest.mark.criu
def test_library_kernels_survive_checkpoint_daemon_restart_restore(demo, npusim_daemon, reference,
                                                                   tmp_path) -> None:
    ref = reference([str(demo.exe), "steps", str(STEPS), "0", str(demo.fatbin)])
    assert len(ref) == STEPS + 1
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(under_agent([str(demo.exe), "steps", str(STEPS), str(SLEEP_MS), str(demo.fatbin)]),
                 tmp_path / "demo.out", env={**npusim_daemon.env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=60)
        live = agent_status(w.pid, npusim_daemon.env)["device"]["resources"]
        # the library's embedded binary and the fatbin; scale_add and blend, scale_add of the fatbin
        assert live["binaries"] == 2 and live["functions"] == 3, live
        checkpoint_and_restore_after_daemon_restart(w, npusim_daemon, ref, AT, tmp_path / "ck", gate)
    finally:
        w.stop()
