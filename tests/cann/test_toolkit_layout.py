"""The toolkit is laid out as CANN installs it: set_env.sh and bin/setenv.bash (sourced by the
samples' run.sh under `set -euo pipefail`), lib64/libacl_rt.so next to libascendcl.so, and the
ascendc.cmake that sample CMakeLists include; a sample-style CMake project builds and runs (its
kernel libraries: test_ascendc_library.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CMAKE_PROJECT = """
cmake_minimum_required(VERSION 3.16.0)
project(Npusim_Layout_Sample)
set(ASCENDC_CMAKE_DIR $ENV{ASCENDC_CMAKE_DIR})
include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)
include_directories(${ASCEND_CANN_PACKAGE_PATH}/include)
link_directories(${ASCEND_CANN_PACKAGE_PATH}/lib64)
add_executable(by_path main.c)
target_link_libraries(by_path PRIVATE ${ASCEND_CANN_PACKAGE_PATH}/lib64/libacl_rt.so)
add_executable(by_name main.c)
target_link_libraries(by_name PRIVATE ascendcl)
"""

MAIN_C = r"""
#include <stdio.h>
#include "acl/acl.h"
int main(void) {
    if (aclInit(NULL) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) return 1;
    printf("[SUCCESS] soc %s\n", aclrtGetSocName());
    return aclrtResetDeviceForce(0) == ACL_SUCCESS && aclFinalize() == ACL_SUCCESS ? 0 : 1;
}
"""


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("script", ["set_env.sh", "bin/setenv.bash"])
def test_env_scripts_set_what_cann_sets(device_env, script) -> None:
    home = device_env["ASCEND_TOOLKIT_HOME"]
    r = _bash(f'set -euo pipefail; unset LD_LIBRARY_PATH ASCEND_HOME_PATH; source "{home}/{script}"; '
              f'source "{home}/{script}"; '  # twice: the library path once
              'echo "$ASCEND_TOOLKIT_HOME|$ASCEND_HOME_PATH|$ASCEND_INSTALL_PATH|$LD_LIBRARY_PATH"',
              {"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    real = str(Path(home).resolve())
    assert r.stdout.strip() == f"{real}|{real}|{real}|{real}/lib64"


def test_sample_style_cmake_project_builds_and_runs(npusim_daemon, device_env, tmp_path) -> None:
    if not shutil.which("cmake"):
        pytest.skip("cmake is required")
    home = device_env["ASCEND_TOOLKIT_HOME"]
    src = tmp_path / "sample"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    (src / "main.c").write_text(MAIN_C)
    env = {**npusim_daemon.env, "ASCENDC_CMAKE_DIR": f"{home}/tikcpp/ascendc_kernel_cmake"}
    r = _bash(f'set -euo pipefail; source "{home}/bin/setenv.bash"; cd "{src}"; '
              'cmake -B build -DASCEND_CANN_PACKAGE_PATH="$ASCEND_HOME_PATH" >/dev/null; '
              'cmake --build build >/dev/null; ./build/by_path; ./build/by_name', env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["[SUCCESS] soc npusim"] * 2
