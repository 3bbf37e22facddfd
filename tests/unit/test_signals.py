"""core/signals.py: a SIGINT or SIGTERM that lands inside threading.Thread.start() (the write-behind's
and the seal's fsync threads start at random instants of a live checkpoint) is delivered again once
start() has returned: raised there, it would break the new thread's bookkeeping and Python would
print "Exception ignored in thread started by ... KeyError" beside the error line."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import pytest

from npusnap_cli.core.signals import Signals
from npusnap_cli.errors import Interrupted


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_thread_start_comes_again_after_it(sig: signal.Signals,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    real = threading._start_new_thread  # type: ignore[attr-defined]

    def start_then_signal(*args: Any) -> Any:  # the signal arrives the instant the thread began
        ident = real(*args)
        signal.raise_signal(sig)
        return ident

    monkeypatch.setattr(threading, "_start_new_thread", start_then_signal)
    old_alarm = signal.getsignal(signal.SIGALRM)
    ran = threading.Event()
    t = threading.Thread(target=ran.set, name="fsync", daemon=True)
    try:
        with Signals(), pytest.raises(Interrupted):
            t.start()  # returns: the signal is held for a moment
            assert t.is_alive() or ran.is_set()
            time.sleep(1)  # ... and raised here
    finally:
        signal.signal(signal.SIGALRM, old_alarm)
    t.join(5)
    assert ran.is_set() and not t.is_alive() and unraisable == []
