"""Helpers for npusim tests: compile C programs against the installed toolkit, run workloads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

# Prepended to every C test program: CHECK(call) aborts with the failing line and code, and
# EXPECT(call, code) asserts a specific aclError.
C_PRELUDE = r"""
#include <acl/acl.h>
#include <acl/npusim.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHECK(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, rc_); exit(1); } } while (0)
#define EXPECT(x, code) do { aclError rc_ = (x); if (rc_ != (code)) { \
    fprintf(stderr, "%s:%d: %s = %d, expected %d\n", __FILE__, __LINE__, #x, rc_, (int)(code)); exit(1); } } while (0)
#define ASSERT(c) do { if (!(c)) { fprintf(stderr, "%s:%d: assertion %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)
"""


def compile_c(source: str, toolkit: Path, tmp_path: Path, name: str = "prog") -> Path:
    """Builds source exactly as a CANN user would: cc -I$TK/include -L$TK/lib64 -lascendcl."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is required"
    src = tmp_path / f"{name}.c"
    src.write_text(C_PRELUDE + textwrap.dedent(source))
    exe = tmp_path / name
    subprocess.run([cc, "-O1", "-Wall", "-Werror", str(src), f"-I{toolkit / 'include'}",
                    f"-L{toolkit / 'lib64'}", "-lascendcl", "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def run_c(exe: Path, toolkit: Path, env: dict, timeout: float = 60) -> str:
    env = {**env, "LD_LIBRARY_PATH": str(toolkit / "lib64")}
    res = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{exe.name} failed ({res.returncode}):\n{res.stdout}{res.stderr}"
    return res.stdout


def build_and_run(source: str, daemon, tmp_path: Path) -> str:
    """Compiles a C test program against daemon.toolkit and runs it as a client of daemon."""
    return run_c(compile_c(source, daemon.toolkit, tmp_path), daemon.toolkit, daemon.env)


def run_py(code: str, env: dict, timeout: float = 60) -> str:
    """Runs a Python workload in its own process (one npusim client) and returns its stdout."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"workload failed ({res.returncode}):\n{res.stdout}{res.stderr}"
    return res.stdout


def spawn_py(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
