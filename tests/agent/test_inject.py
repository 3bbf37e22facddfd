"""npusnap-inject: loading the agent into processes started without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from npusnap_cli.platform import agent as ag

from .support import assert_sequence, proc_state, python_loop_argv


def run_injector(injector: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(injector), *args], capture_output=True, text=True, timeout=60)


def assert_running(t) -> None:  # type: ignore[no-untyped-def]
    # never left stopped: not 't' (tracing stop) nor 'T' (stopped)
    for _ in range(5):
        assert t.state() not in ("t", "T", "gone", "Z"), t.state()
        time.sleep(0.02)


def test_inject_into_c_program_in_nanosleep(spawn, agent_lib, injector, c_programs):
    t = spawn([str(c_programs["sleeper"])])
    t.wait_ready()
    before = t.wait_numbers_past(3)
    assert not ag.has_agent(t.pid)
    reply = ag.inject(t.pid, library=agent_lib, injector=injector)
    assert reply.ok and reply.pid == t.pid and reply.state == "RUNNING"
    assert ag.has_agent(t.pid)
    assert_running(t)
    after = t.wait_numbers_past(len(before) + 10)
    assert_sequence(after)
    assert not [x for x in t.lines() if "EINTR" in x], "nanosleep was interrupted, not restarted"
    assert ag.AgentClient(t.pid).status().ok


def test_inject_into_c_program_blocked_in_read(spawn, agent_lib, injector, c_programs):
    t = spawn([str(c_programs["reader"])], stdin=subprocess.PIPE)
    try:
        t.wait_ready()
        time.sleep(0.1)  # let it block in read(0)
        assert proc_state(t.pid) == "S"
        r = run_injector(injector, str(t.pid), str(agent_lib))
        assert r.returncode == 0, r.stderr
        assert ag._wait_ready(t.pid, 10).ok
        assert_running(t)
        t.proc.stdin.write(b"hello\n")
        t.proc.stdin.flush()
        lines = t.wait_for(lambda ls: "got hello" in ls, 10, "echo")
        assert not [x for x in lines if "error" in x], lines
    finally:
        t.proc.stdin.close()


def test_inject_into_python_loop(spawn, agent_lib, injector):
    t = spawn(python_loop_argv())
    t.wait_ready()
    before = t.wait_numbers_past(3)
    ag.inject(t.pid, library=agent_lib, injector=injector)
    assert_running(t)
    assert_sequence(t.wait_numbers_past(len(before) + 10))
    # injecting again is a no-op that still answers
    assert ag.inject(t.pid, library=agent_lib, injector=injector).ok
    r = run_injector(injector, str(t.pid), str(agent_lib))  # raw: dlopen refcount only
    assert r.returncode == 0, r.stderr
    assert ag.AgentClient(t.pid).ping().ok
    assert_sequence(t.wait_numbers_past(len(t.numbers()) + 5))


def test_inject_nonexistent_pid(injector, agent_lib):
    r = run_injector(injector, "4000000", str(agent_lib))
    assert r.returncode == ag.INJECT_NO_PROCESS
    assert "no such process 4000000" in r.stderr and "hint" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(ag.InjectFailed) as ei:
        ag.inject(4_000_000, library=agent_lib, injector=injector)
    assert ei.value.exit_status == ag.INJECT_NO_PROCESS and ei.value.hint


def test_inject_missing_library_leaves_target_alone(spawn, injector, c_programs, tmp_path):
    t = spawn([str(c_programs["sleeper"])])
    t.wait_ready()
    r = run_injector(injector, str(t.pid), str(tmp_path / "nope.so"))
    assert r.returncode == ag.INJECT_USAGE and "not found" in r.stderr
    r = run_injector(injector, str(t.pid), "relative.so")
    assert r.returncode == ag.INJECT_USAGE and "absolute" in r.stderr
    assert_running(t)
    assert_sequence(t.wait_numbers_past(len(t.numbers()) + 5))


def test_inject_library_that_fails_to_load(spawn, injector, c_programs, tmp_path):
    """dlopen runs in the target and fails: dlerror's message, target unharmed."""
    bogus = tmp_path / "not-a-library.so"
    bogus.write_text("this is not an ELF file\n")
    t = spawn([str(c_programs["sleeper"])])
    t.wait_ready()
    n = len(t.wait_numbers_past(2))
    r = run_injector(injector, str(t.pid), str(bogus))
    assert r.returncode == ag.INJECT_DLOPEN_FAILED, r.stderr
    assert "could not load" in r.stderr and str(bogus) in r.stderr
    assert "invalid ELF header" in r.stderr or "file too short" in r.stderr, r.stderr
    assert_running(t)
    assert_sequence(t.wait_numbers_past(n + 10))
    assert not [x for x in t.lines() if "EINTR" in x]
    with pytest.raises(ag.InjectFailed, match="could not load"):
        ag.inject(t.pid, library=bogus, injector=injector)


def test_inject_stopped_target_is_refused(spawn, agent_lib, injector, c_programs):
    t = spawn([str(c_programs["sleeper"])])
    t.wait_ready()
    os.kill(t.pid, 19)  # SIGSTOP
    try:
        deadline = time.monotonic() + 5
        while t.state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        r = run_injector(injector, str(t.pid), str(agent_lib))
        assert r.returncode == ag.INJECT_FAILED and "kill -CONT" in r.stderr
        assert t.state() == "T"  # left as it was: stopped by its owner, not by us
    finally:
        os.kill(t.pid, 18)  # SIGCONT
    assert_sequence(t.wait_numbers_past(len(t.numbers()) + 5))


def test_inject_without_permission(spawn, agent_lib, injector, c_programs):
    if os.geteuid() != 0:
        pytest.skip("needs root to run the injector as another uid")
    t = spawn([str(c_programs["sleeper"])])
    t.wait_ready()

    def demote() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    # pytest's temporary directories are 0700: give nobody a copy it can run
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        exe = Path(d) / "npusnap-inject"
        lib = Path(d) / agent_lib.name
        shutil.copy(injector, exe)
        shutil.copy(agent_lib, lib)
        r = subprocess.run(
            [str(exe), str(t.pid), str(lib)],
            capture_output=True, text=True, timeout=30, preexec_fn=demote,
        )  # fmt: skip
    assert r.returncode == ag.INJECT_PERMISSION, r.stderr
    assert "ptrace not permitted" in r.stderr and "CAP_SYS_PTRACE" in r.stderr
    assert_running(t)
