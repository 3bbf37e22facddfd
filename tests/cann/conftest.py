"""Fixtures for the CANN-surface tests: programs in tests/cann built as a CANN user builds them,
with nothing but the include and library paths `npusnap device env` prints, and the device binary
(tests/cann/test_kernels.c) built the way npusim/kernel.h documents."""

from __future__ import annotations

import re
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
def toolkit_home() -> Path:
    """ASCEND_TOOLKIT_HOME as `npusnap device env` prints it."""
    r = npusnap("device", "env")
    assert r.returncode == 0, r.stderr
    m = re.search(r"^export ASCEND_TOOLKIT_HOME=(\S+)$", r.stdout, re.M)
    assert m, r.stdout
    return Path(m.group(1))


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("a C compiler is required")
    return cc


@pytest.fixture(scope="session")
def cann_program(toolkit_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """cann_program("kernel_api.c", "-lascendcl"): tests/cann/NAME built against the toolkit."""
    out_dir = tmp_path_factory.mktemp("cann")

    def build(source: str, *libs: str) -> Path:
        exe = out_dir / Path(source).stem
        if not exe.exists():
            r = subprocess.run([_cc(), "-O1", "-Wall", "-Werror", str(HERE / source), f"-I{toolkit_home / 'include'}",
                                f"-L{toolkit_home / 'lib64'}", *libs, f"-Wl,-rpath,{toolkit_home / 'lib64'}",
                                "-o", str(exe)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
        return exe

    return build


@pytest.fixture(scope="session")
def kernels_so(toolkit_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' device binary: cc -shared -fPIC -I$ASCEND_TOOLKIT_HOME/include."""
    out = tmp_path_factory.mktemp("kernels") / "test_kernels.so"
    r = subprocess.run([_cc(), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", str(HERE / "test_kernels.c"),
                        f"-I{toolkit_home / 'include'}", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out
