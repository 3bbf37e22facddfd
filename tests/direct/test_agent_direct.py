"""The agent's `backup external` / `restore external` on a runtime without npusim's direct path
(a CANN-like runtime): refused clearly, and the in-process path still works."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from npusnap_cli import native
from npusnap_cli.platform import agent as ag
from npusnap_cli.platform import simimages

CANN_LIKE = r"""
int aclrtSnapShotProcessLock(int pid, void *r) { (void)pid; (void)r; return 0; }
int aclrtSnapShotProcessBackup(int pid, void *r) { (void)pid; (void)r; return 0; }
int aclrtSnapShotProcessRestore(int pid, void *r) { (void)pid; (void)r; return 0; }
int aclrtSnapShotProcessUnlock(int pid, void *r) { (void)pid; (void)r; return 0; }
"""


def test_external_refused_without_the_direct_path(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("a C compiler is required")
    src = tmp_path / "cann.c"
    src.write_text(CANN_LIKE)
    lib = tmp_path / "libcann_like.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    code = f"import ctypes, time; ctypes.CDLL({str(lib)!r}); print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={"LD_PRELOAD": str(native.AGENT_LIB), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        ag._wait_ready(proc.pid, 10)
        c = ag.AgentClient(proc.pid)
        assert not simimages.supports_direct(proc.pid)
        c.lock(5)
        with pytest.raises(ag.AgentError, match="no direct data path") as ei:
            c.backup(external=True)
        assert ei.value.code == ag.E_UNSUPPORTED and ei.value.reply.state == "LOCKED"
        assert c.backup().state == "BACKED_UP"
        with pytest.raises(ag.AgentError) as ei:
            c.restore(external=True)
        assert ei.value.code == ag.E_UNSUPPORTED
        assert c.restore().state == "LOCKED"
        assert c.unlock().state == "RUNNING"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
