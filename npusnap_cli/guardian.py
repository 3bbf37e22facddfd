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
import os, shutil, signal, subprocess, sys
staging, python = sys.argv[1], sys.argv[2]
data = b""
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    data += chunk
words = data.decode().split()
if words[-1:] != ["done"]:
    pids = [int(w) for w in words if w.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    if "recover" in words and pids:  # direct path: the device data is only in staging/device
        subprocess.run([python, "-m", "npusnap_cli", "recover", str(pids[0]),
                        "--device-images", os.path.join(staging, "device")],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=3600)
    shutil.rmtree(staging, ignore_errors=True)
"""


class Guardian:
    def __init__(self, staging: Path, pid: int) -> None:
        from .criu import clean_env

        self.staging = staging
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SCRIPT, str(staging), sys.executable],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C aimed at us must not take it down too
            env=clean_env(),
        )
        self._say(str(pid))  # the workload's root comes first

    def watch(self, pids: list[int]) -> None:
        """Resume these if we die (CRIU is about to leave them stopped)."""
        self._say(" ".join(map(str, pids)))

    def recover_from(self, device_dir: Path) -> None:
        """The device data is about to exist only in device_dir: if we die, put it back
        (`npusnap recover PID --device-images`) before removing the partial checkpoint."""
        assert device_dir.parent == self.staging
        self._say("recover")

    def _say(self, words: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(words.encode() + b" ")
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
