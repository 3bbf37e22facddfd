"""npusnap: checkpoint/restore for Linux processes that hold accelerator state."""

import _signal  # type: ignore[import-not-found]  # builtin: `signal` imports enum, a window a Ctrl-C hits
import os as _os
import sys as _sys

__version__ = "0.1.0"


def _interrupted_while_starting(signum: int, frame: object) -> None:
    # Nothing has been done yet: say so in one line instead of dying by SIGINT (exit -2). A CRIU
    # started early goes too (the module may be half imported: nothing started then).
    drop = getattr(_sys.modules.get(__name__ + ".platform.criustart"), "drop", None)
    if drop is not None:
        drop()
    _os.write(2, b"npusnap: error: interrupted while starting; nothing was done\n")
    _os._exit(130)


# The CLI's own process (the `npusnap` launcher or `python -m npusnap_cli`), until main() takes over.
if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "npusnap":
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)
    # The `npusnap` launcher (native/launcher) kept SIGINT blocked through CPython's own
    # start-up; with the handler in place, a Ctrl-C pending since then is handled now.
    if _os.environ.pop("NPUSNAP_UNBLOCK_SIGINT", None):
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_signal.SIGINT])
    # CRIU's kernel probes, for a checkpoint or restore, run while the rest of npusnap is imported.
    from .platform import criustart as _criustart

    _criustart.start(_sys.argv[1:])
