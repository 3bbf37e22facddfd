"""A process tree read from the kernel's children lists is the tree a scan of all /proc finds:
root first, breadth first, with the children a non-main thread forked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from npusnap_cli.platform import procfs

# The root forks a shell with two sleeps from its main thread, and a sleep from another thread
# (that child is on the thread's children list only), then says so and waits.
_TREE = """
import subprocess, sys, threading
kids = [subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"])]
t = threading.Thread(target=lambda: kids.append(subprocess.Popen(["sleep", "300"])))
t.start(); t.join()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not procfs._HAS_CHILDREN_LISTS, reason="this kernel keeps no /proc/PID/task/TID/children")
def test_the_children_lists_give_the_tree_a_scan_of_proc_gives() -> None:
    root = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None and root.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60  # the shell forks its two sleeps on its own time
        while len(procfs._tree_from_scan(root.pid)) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        scanned = procfs._tree_from_scan(root.pid)
        assert len(scanned) == 5, scanned  # root, sh, its two sleeps, the thread's sleep
        assert procfs._tree_from_children_lists(root.pid) == scanned
        assert procfs.process_tree(root.pid) == scanned
        assert procfs._tree_from_children_lists(2 ** 22 + 1) == []  # no such process
    finally:
        for p in reversed(procfs._tree_from_scan(root.pid)):  # leaves first; their zombies go to init
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        root.communicate(timeout=60)
