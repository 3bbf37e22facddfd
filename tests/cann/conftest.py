"""Fixtures for the CANN runtime surface tests: the toolkit environment exactly as
`npusnap device env` prints it, and the sample-style programs of this directory built
with nothing but that environment's include and library paths; the kernel tests' device binary
(test_kernels.c) built the way npusim/kernel.h documents."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers import npusnap
from tests.pipeline.conftest import reference, reference_daemon  # noqa: F401  (shared fixtures)
from tests.security.conftest import group_daemon, scratch  # noqa: F401  (a root daemon serving the group)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def device_env() -> dict[str, str]:
    """The variables `eval "$(npusnap device env)"` would export."""
    r = npusnap("device", "env", check=True)
    env: dict[str, str] = {}
    for line in r.stdout.splitlines():
        words = shlex.split(line)
        assert words[0] == "export" and "=" in words[1], line
        key, _, value = words[1].partition("=")
        env[key] = value
    assert {"ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_INSTALL_PATH", "LD_LIBRARY_PATH"} <= env.keys(), env
    return env


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("a C compiler is required")
    return cc


def _compile(source: Path, exe: Path, home: Path, *flags: str) -> Path:
    """tests/cann's C program built with nothing but the toolkit's include and lib64 paths."""
    r = subprocess.run([_cc(), "-Wall", "-Werror", str(source), f"-I{home / 'include'}", f"-L{home / 'lib64'}", *flags,
                        "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def _builder(home: Path, out_dir: Path, *flags: str) -> Callable[[str], Path]:
    """build(NAME): tests/cann/NAME.c compiled once per session with flags."""
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            built[name] = _compile(HERE / f"{name}.c", out_dir / name, home, *flags)
        return built[name]

    return build


@pytest.fixture(scope="session")
def build_program(device_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """build_program("cann_api"): tests/cann/cann_api.c compiled as a CANN user would, against
    $ASCEND_TOOLKIT_HOME/include and -lacl_rt from $ASCEND_TOOLKIT_HOME/lib64."""
    return _builder(Path(device_env["ASCEND_TOOLKIT_HOME"]), tmp_path_factory.mktemp("cann-bin"),
                    "-O2", "-Wno-deprecated-declarations", "-lacl_rt", "-lpthread")

# The kernel tests (cann-kernels): programs that link the libraries they name.

@pytest.fixture(scope="session")
def toolkit_home(device_env: dict[str, str]) -> Path:
    return Path(device_env["ASCEND_TOOLKIT_HOME"])


@pytest.fixture(scope="session")
def cann_program(toolkit_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """cann_program("kernel_api.c", "-lascendcl"): tests/cann/NAME built against the toolkit."""
    out_dir = tmp_path_factory.mktemp("cann")

    def build(source: str, *libs: str) -> Path:
        exe = out_dir / Path(source).stem
        if exe.exists():
            return exe
        return _compile(HERE / source, exe, toolkit_home, "-O1", *libs, f"-Wl,-rpath,{toolkit_home / 'lib64'}")

    return build


@pytest.fixture(scope="session")
def kernels_so(toolkit_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' device binary: cc -shared -fPIC -I$ASCEND_TOOLKIT_HOME/include."""
    out = tmp_path_factory.mktemp("kernels") / "test_kernels.so"
    r = subprocess.run([_cc(), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", str(HERE / "test_kernels.c"),
                        f"-I{toolkit_home / 'include'}", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out
@pytest.fixture(scope="session")
def build_c(device_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """build_c("NAME"): tests/cann/NAME.c linked with -lascendcl from the same paths, with an rpath,
    so it runs under any environment (the IPC and VMM programs run under `npusnap run`)."""
    home = Path(device_env["ASCEND_TOOLKIT_HOME"])
    return _builder(home, tmp_path_factory.mktemp("cann-vmm-bin"), "-O1", "-lascendcl", "-lpthread",
                    f"-Wl,-rpath,{home / 'lib64'}")
