"""cli._unraisable: a Ctrl-C that Python swallowed in a finalizer is raised again in the main flow,
not inside the hook (where it would be printed as "Exception ignored" and lost)."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import pytest

from npusnap_cli import cli


class _InterruptedFinalizer:
    def __del__(self) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C landing while a finalizer runs


def _raise(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def test_a_ctrl_c_swallowed_by_a_finalizer_reaches_the_main_flow(capsys: pytest.CaptureFixture[str]) -> None:
    previous_int, previous_alrm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGALRM)
    previous_hook = sys.unraisablehook
    signal.signal(signal.SIGINT, _raise)
    sys.unraisablehook = cli._unraisable
    try:
        with pytest.raises(KeyboardInterrupt):
            _InterruptedFinalizer()  # collected at once: its __del__ runs and is swallowed
            time.sleep(5)            # the interrupt arrives here, well before the sleep ends
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGALRM, previous_alrm)
    assert "Exception ignored" not in capsys.readouterr().err
