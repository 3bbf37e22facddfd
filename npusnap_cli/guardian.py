"""A guardian for the moments the workload is stopped.

CRIU leaves the dumped tree stopped until the checkpoint is committed. If
npusnap died then (SIGKILL, OOM), nothing would ever resume it. The guardian is
a tiny separate process, in its own session, holding the read end of a pipe: if
the pipe closes without the word "done", it resumes the tree and removes the
partial checkpoint. The agent's lease then unlocks the device by itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = r"""
import os, shutil, signal, sys
data = b""
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    data += chunk
lines = data.decode().split()
if lines[-1:] != ["done"]:
    for word in lines:
        try:
            os.kill(int(word), signal.SIGCONT)
        except (OSError, ValueError):
            pass
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


class Guardian:
    def __init__(self, staging: Path) -> None:
        from .criu import clean_env

        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SCRIPT, str(staging)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C aimed at us must not take it down too
            env=clean_env(),
        )

    def watch(self, pids: list[int]) -> None:
        """Resume these if we die (CRIU is about to leave them stopped)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(map(str, pids)).encode() + b" ")
        self.proc.stdin.flush()

    def release(self) -> None:
        """We finished (committed or rolled back): the guardian leaves everything as it is."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b" done")
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
