"""Sample-style C programs (tests/cann/*.c), built as a CANN user builds them: with nothing but
the include and library paths that `npusnap device env` prints."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers import npusnap

HERE = Path(__file__).resolve().parent


def _toolkit_home() -> Path:
    r = npusnap("device", "env", check=True)
    for line in r.stdout.splitlines():
        if line.startswith("export ASCEND_TOOLKIT_HOME="):
            return Path(line.split("=", 1)[1].strip().strip("'\""))
    raise AssertionError(f"no ASCEND_TOOLKIT_HOME in `npusnap device env`:\n{r.stdout}")


@pytest.fixture(scope="session")
def build_c(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """build_c("NAME"): tests/cann/NAME.c compiled and linked against the toolkit (once a session)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("a C compiler is required")
    home = _toolkit_home()
    out = tmp_path_factory.mktemp("cann-bin")
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            exe = out / name
            r = subprocess.run([cc, "-O1", "-Wall", "-Werror", str(HERE / f"{name}.c"), f"-I{home / 'include'}",
                                f"-L{home / 'lib64'}", "-lascendcl", "-lpthread", f"-Wl,-rpath,{home / 'lib64'}",
                                "-o", str(exe)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            built[name] = exe
        return built[name]

    return build
