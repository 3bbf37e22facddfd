"""The in-process backend (sim, ascend): CANN's snapshot API, called inside the target by the
injected agent, commanded through the agent's socket. Device memory is staged in the process's
host memory and CRIU writes it with the rest."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from .. import testhooks
from ..errors import DeviceFailed, Interrupted, LeaseLost, NpusnapError, WrongState
from ..image.format import DeviceState, FileEntry
from ..platform.agent import E_LEASE_LOST, AgentClient, AgentError, AgentProblem, AgentReply, agent_error
from ..platform.simimages import daemon_socket
from .base import BackendName, DataPath, State, unlock_unless_running


class LeaseKeeper:
    """Renews the agent's lease while we work, so the workload unlocks itself if we die.

    Renewals fail while CRIU has the process frozen; that is fine: the agent
    counts only time the process actually ran."""

    def __init__(self, pid: int, lease: float) -> None:
        self.client = AgentClient(pid, connect_timeout=0.5)
        self.lease = lease
        self.lost = False  # the agent said the lease ran out: the next fence() stops the pipeline
        self.held = False  # hold(): no renewals for now
        self.busy = threading.Lock()  # held through each renewal
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"lease-{pid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.lease / 4):
            with self.busy:
                if self.held:
                    continue
                try:
                    self.client.renew(self.lease)
                except AgentError as e:
                    if e.code == E_LEASE_LOST:
                        self.lost = True
                        return
                except AgentProblem:
                    pass

    def hold(self, held: bool) -> None:
        """held: no renewal from now on (one under way ends first) until hold(False)."""
        with self.busy:
            self.held = held

    def renew_now(self) -> bool:
        """Renew at once; False when the agent says the lease ran out."""
        if self.lost:
            return False
        try:
            self.client.renew(self.lease)
        except AgentError as e:
            if e.code != E_LEASE_LOST:
                raise
            self.lost = True
        return not self.lost

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


class AgentBackend:
    """CANN-style in-process snapshot, commanded through the agent's socket."""

    method = DataPath.IN_PROCESS

    def __init__(self, pid: int, name: BackendName) -> None:
        self.pid = pid
        self.name = name
        self.client = AgentClient(pid)
        self.last_reply: Optional[AgentReply] = None  # the agent's answer to the latest command
        self._keeper: Optional[LeaseKeeper] = None
        self._lease_lost_at: Optional[int] = None  # the agent's lease-lost flag in the process's memory
        self._freezing = False  # frozen_by_criu(): a lease armed meanwhile is not renewed either
        self.daemon: Optional[str] = None  # use_daemon(): the npusim daemon the restore goes to

    def _call(self, what: str, *args: Any, **kwargs: Any) -> AgentReply:
        try:
            reply: AgentReply = getattr(self.client, what)(*args, **kwargs)
        except AgentProblem as e:
            raise agent_error(e, f"device {what} of process {self.pid}") from e
        self.last_reply = reply
        return reply

    def state(self) -> State:
        return State.parse(self._call("status").state)

    def describe(self) -> DeviceState:
        reply = self.last_reply if self.last_reply is not None and self.last_reply.device else self._call("status")
        dev = reply.device or {}
        return DeviceState(
            backend=self.name.value,
            devices=list(dev.get("devices", [])),
            allocations=int(dev.get("allocations", 0)),
            bytes=int(dev.get("bytes", 0)),
            method=self.method.value,
            runtime=reply.runtime,
            endpoint=daemon_socket(self.pid) if self.name == BackendName.SIM else None,
            resources={str(k): int(v) for k, v in (dev.get("resources") or {}).items()},
        )

    def communicators(self) -> list[dict[str, Any]]:
        """The HCCL communicators the process holds (npusimSnapshotInfo's list; none on a runtime
        without HCCL), as the agent's latest status says."""
        reply = self.last_reply if self.last_reply is not None and self.last_reply.device else self._call("status")
        return list((reply.device or {}).get("communicators") or [])

    def hccl_option(self, key: str, value: str) -> None:
        """An HCCL setting for the next lock or restore (agent.h's `hccl KEY VALUE`)."""
        self._call("hccl", key, value)

    def use_daemon(self, socket: str) -> None:
        """npusim: the next restore reconnects the runtime to the daemon on socket (this host's),
        not to the one its environment named (agent `hccl socket PATH`, npusimSnapShotUseDaemon)."""
        self._call("hccl", "socket", socket)
        self.daemon = socket

    def lock(self, timeout: float, lease: Optional[float] = None) -> None:
        reply = self._call("lock", *((timeout, lease) if lease else (timeout,)))
        if lease:
            self._keeper = LeaseKeeper(self.pid, lease)
            self._keeper.hold(self._freezing)
            self._lease_lost_at = reply.lease_lost_at

    def backup(self, device_dir: Optional[Path] = None) -> list[FileEntry]:
        self._call("backup")
        return []

    def restore(self, device_dir: Optional[Path] = None, files: Sequence[FileEntry] = ()) -> None:
        self._call("restore")

    def unlock(self) -> None:
        testhooks.pause("device-unlock")
        self.release()
        self._call("unlock")

    def back_to_running(self) -> None:
        state = self.state()
        if state == State.BACKED_UP:
            self.restore()
        if state in (State.LOCKED, State.BACKED_UP):
            self.unlock()
        self.release()

    def adopt_lease(self, lease: float) -> None:
        """Restore: the restored agent still holds the dump's lease; keep it renewed while we
        finish (none armed, or already run out: the agent's state then says what is left)."""
        try:
            self.client.renew(lease)
        except AgentProblem:
            return
        self._keeper = LeaseKeeper(self.pid, lease)

    def fence(self) -> None:
        if self._keeper is None:
            return
        try:
            ours = self._keeper.renew_now()
        except AgentProblem as e:
            raise agent_error(e, f"renewing the lease on process {self.pid}'s device lock") from e
        if not ours:
            raise self._lease_lost("while npusnap was not running")

    def _lease_lost(self, when: str) -> LeaseLost:
        return LeaseLost(f"the lease on process {self.pid}'s device lock ran out {when}; "
                         "the agent took the workload back, so npusnap stops here")

    @contextlib.contextmanager
    def frozen_by_criu(self) -> Iterator[None]:
        """Around CRIU's dump. The lease is renewed at the start, then not until the end: a
        renewal's connection open as CRIU freezes the tree is a socket CRIU refuses to dump, and
        the freeze stops the lease's clock anyway. At the end (the tree frozen, the agent unable to
        answer) the agent's flag is read from the process's memory, which the images hold too: a
        CLI stopped past the lease before the freeze finds it set, the workload taken back. A dump
        that failed (the tree runs again) because of that is reported so, not as CRIU's error
        (npusim's runtime, taken back, holds its daemon connection again: an external socket)."""
        self.fence()
        self._freezing = True
        if self._keeper is not None:
            self._keeper.hold(True)
        try:
            try:
                yield
            except NpusnapError as e:  # an interrupt stays one
                if not isinstance(e, Interrupted) and self._keeper is not None and self._ran_out(must_know=False):
                    raise self._lease_lost("while npusnap was not running") from e
                raise
            if self._keeper is not None and self._ran_out(must_know=True):
                raise self._lease_lost("before CRIU froze it")
        finally:
            self._freezing = False
            if self._keeper is not None:
                self._keeper.hold(False)

    def _ran_out(self, must_know: bool) -> bool:
        """Whether the lease ran out: the keeper heard so, or the agent's flag says so, read from the
        process's memory (no answer needed: the process may be frozen). Unreadable: DeviceFailed
        where we must know, else False. An agent older than the flag's address (a workload started
        before npusnap was upgraded) does not say where it is: not known, as before."""
        assert self._keeper is not None
        if self._keeper.lost:
            return True
        if self._lease_lost_at is None:
            return False
        try:
            fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            try:
                flag = os.pread(fd, 4, self._lease_lost_at)
            finally:
                os.close(fd)
            if len(flag) != 4:
                raise OSError("short read")
        except OSError as e:
            if not must_know:
                return False
            raise DeviceFailed(f"cannot tell whether the lease on process {self.pid}'s device lock held "
                               f"until CRIU froze it (its memory: {e})") from None
        return int.from_bytes(flag, sys.byteorder) != 0

    def release(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None

    def finish_after_commit(self, device_dir: Path, files: Sequence[FileEntry]) -> None:
        """If we were stopped past the lease, the agent may have done part of this already:
        only what is left is done."""
        if self.state() == State.BACKED_UP:
            try:
                self.restore(device_dir, files)
            except WrongState:
                if self.state() == State.BACKED_UP:  # refused for another reason than the agent's own restore
                    raise
        unlock_unless_running(self)
