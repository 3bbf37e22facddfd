"""Imports a command will need later, done while it waits, on a thread of their own.

A command spends much of its life waiting on CRIU (its dump or restore runs in another process).
The modules it needs after that wait (the manifest's YAML, rich for the closing line) are named
up front with later(), and imported by a daemon thread only once the main thread blocks on CRIU
(idle(), called where the request is sent): started earlier, the thread would take the GIL from
the main thread's own imports and delay CRIU's start by as much. Import is thread-safe; a module
still being imported when the main thread needs it is simply waited for. A failure here is
ignored: the main thread's own import then reports it."""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Callable, Optional, Union

Need = Union[str, Callable[[], object]]

_pending: list[Need] = []
_lock = threading.Lock()
SWITCH_S = 0.0005
_running = 0  # warmup threads at work
_switch = 0.005  # the switch interval before they started


def later(*needs: Need) -> None:
    """Import each module name (or call each loader), in order, the next time the command waits."""
    with _lock:
        _pending.extend(needs)


def idle() -> Optional[threading.Thread]:
    """The main thread is about to block: run what later() named, on a daemon thread."""
    with _lock:
        needs = _pending[:]
        _pending.clear()
    if not needs:
        return None
    return start(*needs)


def start(*needs: Need) -> threading.Thread:
    """Import each module name (or call each loader) in order, on a daemon thread, now. Meanwhile
    the interpreter switches threads every SWITCH_S rather than every 5 ms: the main thread, woken
    by CRIU's answer, would otherwise wait up to 5 ms for the GIL an import holds."""
    def run() -> None:
        global _running, _switch
        with _lock:
            if not _running:
                _switch = sys.getswitchinterval()
                sys.setswitchinterval(SWITCH_S)
            _running += 1
        try:
            for need in needs:
                try:
                    importlib.import_module(need) if isinstance(need, str) else need()
                except Exception:
                    pass
        finally:
            with _lock:
                _running -= 1
                if not _running:
                    sys.setswitchinterval(_switch)

    thread = threading.Thread(target=run, name="warmup", daemon=True)
    thread.start()
    return thread
