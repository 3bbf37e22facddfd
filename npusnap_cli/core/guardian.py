"""A guardian for the moments the workload cannot look after itself.

Checkpoint: CRIU leaves the dumped tree stopped until the checkpoint is committed.
If npusnap died then (SIGKILL, OOM), nothing would ever resume it. Restore: between
CRIU's restore and the unlock, the restored tree is locked, waiting for its device
data. The guardian is a tiny separate process, in its own session, holding the read
end of a pipe: if the pipe closes without the word "done", it resumes the tree (and
its descendants, whatever CRIU froze) and removes the partial checkpoint; for a
restore it kills the restored tree instead, so the checkpoint can be restored again.
The agent's lease then unlocks the device by itself. A death after the commit (the
rename that makes DIR valid) ends in the checkpoint's outcome instead: the tree is
killed, or with --leave-running it runs on, its device data from DIR. A process set's
HCCL ranks are recovered together, in the same state: see even_out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

_SCRIPT = r"""
import os, sys  # only these until needed: every command waits for this process's exit
staging, python = sys.argv[1], sys.argv[2]
data = b""
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    data += chunk
words = data.decode().split()
if words[-1:] == ["done"]:
    os._exit(0)  # the usual end, which every command waits for: no interpreter teardown (~8 ms)

def tree(roots):
    # the roots and every descendant now alive: children forked before CRIU froze them count too
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/" + d + "/stat") as f:
                    parent[int(d)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [p for p in roots if p in parent]
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(c for c, pp in parent.items() if pp == p)
    return out

def running(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False

def committed():
    # the checkpoint's rename happened (the staging directory, by its inode, is DIR now): "commit:HEX:DEV:INO:how"
    for w in words:
        if w.startswith("commit:") and w.count(":") == 4:
            final, dev, ino, how = w[7:].split(":")
            try:
                st = os.stat(bytes.fromhex(final).decode())
            except (OSError, ValueError):
                return None
            return (bytes.fromhex(final).decode(), how) if (st.st_dev, st.st_ino) == (int(dev), int(ino)) else None
    return None

def npusnap(*args):
    return subprocess.Popen([python, "-m", "npusnap_cli", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

def even_out(ranks, deadline):
    # A death between the members' backups leaves some HCCL ranks backed up (gone from their
    # communicators) and others only locked (still in them): those are backed up too, so that every
    # rank's recovery re-forms the communicators with all its peers (as a set's own rollback does).
    # Each agent answers once the command it runs (a lock, a backup) is done: all asked at once.
    asked = [(pid, npusnap("status", "--json", pid)) for pid in ranks]
    states = {}
    for pid, p in asked:
        try:
            states[pid] = json.loads(p.communicate(timeout=max(0.0, deadline - time.monotonic()))[0])["state"]
        except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            p.kill()
            p.communicate()
    if "BACKED_UP" in states.values():
        finish([npusnap("backup", pid) for pid, state in states.items() if state == "LOCKED"], deadline)

def finish(procs, deadline):
    for p in procs:
        try:
            p.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()

if words[-1:] != ["done"]:
    import json, shutil, signal, subprocess, time
    deadline = time.monotonic() + 3600
    # A dump or a restore that CRIU is still running: its tree is whole only once CRIU is done.
    for criu in [int(w[5:]) for w in words if w.startswith("criu:") and w[5:].isdigit()]:
        while running(criu):
            time.sleep(0.05)
    done = committed()  # then the outcome is the checkpoint's: its members killed, or run on from DIR
    # a live checkpoint's workload that runs on already needs nothing but its staging removed
    pids = [int(w) for w in words if w.isdigit()] if "resumed" not in words else []
    sig = signal.SIGKILL if "kill" in words or (done and done[1] == "kill") else signal.SIGCONT
    for pid in tree(pids):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    images = done[0] if done else staging  # where the checkpoint's device images are now
    # direct path: the device data is only in staging/device (a set member's: staging/device/PID)
    recovers = [(str(pids[0]), os.path.join(images, "device"))] if "recover" in words and pids else []
    # --live on the direct path: the daemon kept the device memory, which the restore takes back
    recovers += [(str(pids[0]), None)] if "kept" in words and pids else []
    recovers += [(w[5:], None) for w in words if w.startswith("kept:") and w[5:].isdigit()]  # a set member's
    recovers += [(w[8:], os.path.join(images, "device", w[8:])) for w in words
                 if w.startswith("recover:") and w[8:].isdigit()]
    # --live, --compress: the device data staged in memory (/dev/shm), removed after (images:PID:HEX, drop:HEX)
    recovers += [(w.split(":")[1], bytes.fromhex(w.split(":")[2]).decode()) for w in words
                 if w.startswith("images:") and w.count(":") == 2 and w.split(":")[1].isdigit()]
    # HCCL ranks: every one recovered (their lease would do it later), all at once, for each
    # rank's restore waits for its peers' in the set's rendezvous directory, removed after
    hccl = [w[5:] for w in words if w.startswith("hccl:") and w[5:].isdigit()]
    recovers += [(pid, None) for pid in hccl if pid not in [r[0] for r in recovers]]
    if sig == signal.SIGKILL or "resumed" in words:  # resumed: a live checkpoint's workload (a set: all of it) runs on
        recovers = []
    elif hccl and not done and "restoring" not in words:  # restoring: the ranks' restores are under way
        even_out(hccl, deadline)
    # an incremental's chain, parent first: the staged images reference it
    chain = [a for w in words if w.startswith("chain:") for a in ("--parent-images", bytes.fromhex(w[6:]).decode())]
    finish([npusnap("recover", pid, *(["--device-images", device_dir, *chain] if device_dir else []))
            for pid, device_dir in recovers], deadline)
    # --live's device snapshot that will never be written out: the daemon's copies go
    for w in words:
        if w.startswith("snapshot:") and w.count(":") == 2 and w.split(":")[1].isdigit():
            try:
                subprocess.run([python, "-c", "import sys; from npusnap_cli.platform.simimages import drop_snapshot; "
                                "drop_snapshot(int(sys.argv[1]), sys.argv[2])",
                                w.split(":")[1], bytes.fromhex(w.split(":")[2]).decode()],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=60)
            except (OSError, subprocess.SubprocessError):
                pass
    for w in words:
        if w.startswith(("meet:", "remove:", "drop:")):
            shutil.rmtree(bytes.fromhex(w.partition(":")[2]).decode(), ignore_errors=True)
    if staging != "-":
        shutil.rmtree(staging, ignore_errors=True)
"""


# native/guardian: the guardian's waiting half, without an interpreter's start-up (built and
# installed with the package; a source checkout without it runs the script alone).
WAITER = Path(__file__).resolve().parent.parent / "_native" / "bin" / "npusnap-guardian"


class Guardian:
    def __init__(self, staging: Optional[Path], pid: int) -> None:
        """staging: the partial checkpoint to remove if we die (None: a restore, nothing to remove)."""
        from ..platform.criustart import clean_env

        self.staging, self.pid = staging, pid
        argv = [sys.executable, "-I", "-S", "-c", _SCRIPT, str(staging) if staging else "-", sys.executable]
        if os.access(WAITER, os.X_OK):  # reads until we are done; runs the script above only if we die
            argv = [str(WAITER), *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C aimed at us must not take it down too
            env=clean_env(),
        )
        self._say(str(pid))  # the workload's root comes first

    def watch(self, pids: list[int]) -> None:
        """Resume these if we die (CRIU is about to leave them stopped)."""
        self._say(" ".join(map(str, pids)))

    def kill_if_dead(self, pids: list[int]) -> None:
        """Restore: if we die before release(), kill these and their descendants
        (a half-restored tree must not run on, and it holds the checkpoint's pids)."""
        self._say(" ".join(map(str, pids)) + " kill")

    def wait_for_criu(self, pid: int) -> None:
        """CRIU (pid) is dumping or restoring the tree; if we die, act on it only once CRIU is
        done: a tree it dumps after our death would stay stopped, one it restores would run on
        half-restored."""
        self._say(f"criu:{pid}")

    def recover_from(self, device_dir: Path, chain: Sequence[Path] = ()) -> None:
        """The device data is about to exist only in device_dir: if we die, put it back
        (`npusnap recover PID --device-images`, with an incremental's chain of parent images)
        before removing the partial checkpoint."""
        for p in chain:  # hex: a path may hold any byte but the words are split on spaces
            self._say("chain:" + os.fsencode(os.path.abspath(p)).hex())
        if device_dir.parent == self.staging:
            self._say("recover")
            return
        if self.staging is not None and device_dir.parent.parent == self.staging:  # a set member's
            self._say(f"recover:{device_dir.name}")
            return
        # in memory (image/memstage.py): --live's, or --compress's (a set member's in a PID/ of its own)
        member = device_dir.name.isdigit()
        pid = device_dir.name if member else str(self.pid)
        mem = device_dir.parent if member else device_dir
        self._say(f"images:{pid}:{os.fsencode(os.path.abspath(device_dir)).hex()} "
                  f"drop:{os.fsencode(os.path.abspath(mem)).hex()}")

    def recover_kept(self, daemon: str, member: Optional[int] = None) -> None:
        """--live's device snapshot: the daemon (socket) keeps the device memory; if we die, the
        workload takes it back (`npusnap recover PID`) before the partial checkpoint is removed,
        and the daemon drops the snapshot (also once the workload runs on). member: a set member's
        (every member's is recovered and dropped; none once the set runs on: resumed())."""
        kept = "kept" if member is None else f"kept:{member}"
        self._say(f"{kept} snapshot:{member or self.pid}:{os.fsencode(daemon).hex()}")

    def meet(self, directory: Path, pids: list[int], owned: bool = True) -> None:
        """HCCL ranks (pids) that meet in directory: if we die, recover them all at once (their
        restores wait for each other there), then remove the directory if it is ours (owned; a
        job's belongs to its coordinator: the other nodes' ranks meet there too)."""
        words = [f"meet:{str(directory).encode().hex()}"] if owned else []
        self._say(" ".join([*words, *(f"hccl:{p}" for p in pids)]))

    def committing(self, staging: Path, final: Path, kills: bool) -> None:
        """The staging directory is about to be renamed to final (the commit): if we die once it
        has been (the guardian tells by its inode), the checkpoint stands, and its tree is killed
        (kills) or runs on from final's images, as the command would have finished it."""
        st = os.stat(staging)
        self._say(f"commit:{os.fsencode(os.path.abspath(final)).hex()}:{st.st_dev}:{st.st_ino}:"
                  f"{'kill' if kills else 'run'}")

    def restoring(self) -> None:
        """A set's HCCL ranks' in-place device restores are starting (a rollback, running on): if
        we die, every rank is recovered at once as it is (the restores under way meet the rest)."""
        self._say("restoring")

    def remove_after(self, directory: Path) -> None:
        """If we die, remove directory too, after any recovery (--live: the images in memory; a set
        restore: its HCCL ranks' private rendezvous directory)."""
        self._say("remove:" + os.fsencode(os.path.abspath(directory)).hex())

    def resumed(self) -> None:
        """--live: the workload (a set: every member) runs on: if we die, nothing is resumed or
        recovered any more; the daemon's snapshots are dropped, the staging removed."""
        self._say("resumed")

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
        from ..platform.criu import wait_exit

        try:
            wait_exit(self.proc, timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
