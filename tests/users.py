"""A real second user for attack tests, created on first use (useradd) and kept for the run.

Attacks run as that user in one of two ways:
- `as_user(user, fn, *args)`: fork this test process, drop to the user, call fn, and return
  its (JSON-serialisable) result. The venv's interpreter may live under /root, which another
  user cannot execute, so Python-side attacks run in a fork rather than a fresh interpreter.
- `run_as(user, argv)`: exec a program (a compiled attacker, /bin/sh) as the user via setpriv.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pytest

OTHER_USER = "npusnap-mallory"  # the attacker: no groups of ours, no home
DEVICE_GROUP = "npusim-users"  # members may use the software NPU (like CANN's HwHiAiUser)
DEVICE_USER = "npusnap-alice"  # an honest unprivileged user in the device group


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


def _ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", "-f", name], check=True, capture_output=True)
        return grp.getgrnam(name).gr_gid


def _ensure_user(name: str, groups: Sequence[str] = ()) -> User:
    if os.geteuid() != 0:
        pytest.skip("needs root to create and become a second user")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        argv = ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                "--shell", "/usr/sbin/nologin", "--user-group"]
        if groups:
            argv += ["--groups", ",".join(groups)]
        r = subprocess.run([*argv, name], capture_output=True, text=True)
        if r.returncode not in (0, 9):  # 9: created meanwhile by a parallel run
            raise RuntimeError(f"useradd {name} failed: {r.stderr.strip()}") from None
        pw = pwd.getpwnam(name)
    gids = []
    for g in groups:
        gid = _ensure_group(g)
        if name not in grp.getgrgid(gid).gr_mem:
            subprocess.run(["usermod", "-a", "-G", g, name], check=True, capture_output=True)
        gids.append(gid)
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(sorted(gids)))


def traversable(p: Path) -> None:
    """Let the other user walk down to p (pytest's tmp dirs are 0700)."""
    for d in [p, *p.parents]:
        if d == Path("/tmp") or d == Path("/"):
            break
        os.chmod(d, os.stat(d).st_mode & 0o7777 | 0o111)


def other_user() -> User:
    """The attacker: an unprivileged user outside the device group."""
    return _ensure_user(OTHER_USER)


def device_user() -> User:
    """An honest unprivileged user who may use the device (member of DEVICE_GROUP)."""
    _ensure_group(DEVICE_GROUP)
    return _ensure_user(DEVICE_USER, [DEVICE_GROUP])


def device_group() -> int:
    return _ensure_group(DEVICE_GROUP)


def _drop(user: User) -> None:
    os.setgroups(list(user.groups))
    os.setgid(user.gid)
    os.setuid(user.uid)
    os.environ.update(HOME="/nonexistent", USER=user.name, LOGNAME=user.name)
    os.environ.pop("XDG_CONFIG_HOME", None)
    os.environ.pop("XDG_RUNTIME_DIR", None)


def as_user(user: User, fn: Callable[..., Any], *args: Any, timeout: float = 60) -> Any:
    """Call fn(*args) in a forked child running as user; return its result or raise
    RuntimeError with the child's exception text. fn's result must be JSON-serialisable."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            _drop(user)
            try:
                out = {"ok": True, "value": fn(*args)}
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                out = {"ok": False, "error": f"{type(e).__name__}: {e}",
                       "trace": traceback.format_exc()}
            os.write(w, json.dumps(out, default=str).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(child, 0)
    if not raw:
        raise RuntimeError(f"child as {user.name} died without answering (status {status})")
    out = json.loads(raw)
    if not out["ok"]:
        raise RuntimeError(f"as {user.name}: {out['error']}\n{out['trace']}")
    return out["value"]


def _setpriv(user: User, argv: Sequence[str], env: Optional[dict[str, str]]) -> tuple[list[str], dict[str, str]]:
    pre = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}"]
    pre += [f"--groups={','.join(map(str, user.groups))}"] if user.groups else ["--clear-groups"]
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "USER": user.name}
    return [*pre, "--", *argv], {**base, **(env or {})}


def run_as(user: User, argv: Sequence[str], timeout: float = 60, env: Optional[dict[str, str]] = None,
           **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run argv as user (setpriv: exact uid, gid and supplementary groups), captured, text mode."""
    full, full_env = _setpriv(user, argv, env)
    return subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=full_env,
                          stdin=subprocess.DEVNULL, **kw)


def popen_as(user: User, argv: Sequence[str], env: Optional[dict[str, str]] = None,
             **kw: Any) -> subprocess.Popen[str]:
    """Start argv as user in the background (the caller reaps it)."""
    full, full_env = _setpriv(user, argv, env)
    return subprocess.Popen(full, text=True, env=full_env, stdin=subprocess.DEVNULL, **kw)


__all__ = ["User", "other_user", "device_user", "device_group", "as_user", "run_as", "popen_as",
           "OTHER_USER", "DEVICE_GROUP", "DEVICE_USER"]
