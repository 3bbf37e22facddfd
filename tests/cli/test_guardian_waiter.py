"""native/guardian: the guardian's waiting half. Told "done", it exits without ever starting the
Python guardian; when the pipe closes otherwise (the CLI died), the Python guardian runs with
every word it was told as its stdin. Not in tests/unit: it needs the native parts, which the
unprivileged unit suite (tests/test_unit_unprivileged.py) runs without."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from npusnap_cli.native import NATIVE_DIR

WAITER = NATIVE_DIR / "bin" / "npusnap-guardian"
pytestmark = pytest.mark.skipif(not WAITER.is_file(), reason="native parts not built (make setup)")


def _run(words: bytes, out: Path) -> int:
    """The waiter, its script standing in for the Python guardian: it copies its stdin to out."""
    script = "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())"
    proc = subprocess.Popen([str(WAITER), sys.executable, "-I", "-S", "-c", script, str(out)],
                            stdin=subprocess.PIPE, start_new_session=True)
    assert proc.stdin is not None
    for i in range(0, len(words), 1000):  # as the CLI says them: a few words at a time
        proc.stdin.write(words[i:i + 1000])
        proc.stdin.flush()
    proc.stdin.close()
    return proc.wait(timeout=60)


@pytest.mark.parametrize("words", [b"4242 done", b"4242 4243 kill criu:77  done", b"done", b"7 done \n"])
def test_done_ends_it_without_the_python_guardian(tmp_path: Path, words: bytes) -> None:
    assert _run(words, tmp_path / "ran") == 0
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("words", [b"4242 4243 kill", b"", b"4242 undone", b"4242 done 4243",
                                   b" ".join(b"%d" % p for p in range(100000)) + b" recover"])
def test_otherwise_the_python_guardian_gets_every_word(tmp_path: Path, words: bytes) -> None:
    """Anything but a last word "done" (a big tree's pids too: more than a pipe holds)."""
    assert _run(words, tmp_path / "ran") == 0
    assert (tmp_path / "ran").read_bytes() == words
