"""Imports a command will need later, done now on a thread of their own.

A command spends much of its life waiting: on the agent (lock, backup), on CRIU (its dump or
restore runs in another process). The modules it needs after such a wait (the manifest's YAML,
CRIU's RPC messages) are imported meanwhile by a daemon thread, instead of on the critical path.
Import is thread-safe; a module still being imported when the main thread needs it is simply
waited for. A failure here is ignored: the main thread's own import then reports it."""

from __future__ import annotations

import importlib
import threading
from typing import Callable, Union


def start(*needs: Union[str, Callable[[], object]]) -> threading.Thread:
    """Import each module name (or call each loader) in order, on a daemon thread."""
    def run() -> None:
        for need in needs:
            try:
                importlib.import_module(need) if isinstance(need, str) else need()
            except Exception:
                pass

    thread = threading.Thread(target=run, name="warmup", daemon=True)
    thread.start()
    return thread
