"""On a terminal, checkpoint shows each phase live, with the bytes a data phase wrote;
without one, nothing but the result (covered by every other test's one-line stderr)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import Workload, npusnap_cmd, requires_criu


@requires_criu
def test_checkpoint_on_a_terminal_shows_phases_with_bytes(tmp_path: Path) -> None:
    w = Workload([sys.executable, "-c", "b = bytearray(range(256)) * (1 << 18); print('ready', flush=True);"
                  "import time; time.sleep(60)"], tmp_path / "out")
    master, slave = os.openpty()
    try:
        w.wait_for_line("ready")
        proc = subprocess.Popen([*npusnap_cmd(), "checkpoint", str(w.pid), "-D", str(tmp_path / "ck"),
                                 "--device", "none"], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal's other end closed: the command is done
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0, seen.decode(errors="replace")
        text = seen.decode(errors="replace")
        for phase in ("lock", "backup", "dump", "seal"):
            assert phase in text, text
        assert "MiB" in text and "checkpointed" in text, text
    finally:
        os.close(master)
        w.stop()
