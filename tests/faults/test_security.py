"""Security: the agent's socket refuses other users; checkpoint files are 0600 and
directories 0700; inspect/verify on a hostile directory (symlinks to /etc/shadow, a
manifest naming /proc/self/mem, huge sizes, YAML tags) never execute anything nor read
outside the directory."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import yaml

from npusnap_cli.platform import agent as ag
from tests.helpers import npusnap
from tests.users import as_user, other_user

from .support import assert_failed_cleanly, assert_running_intact, start_train, status
from .test_images import pristine  # noqa: F401  (module fixture)

NOBODY = 65534


def as_nobody(argv: list[str]) -> tuple[int, str]:
    """Run npusnap's main(argv) in a forked child switched to uid/gid nobody (the venv's
    interpreter lives under /root, which nobody cannot exec, so a fresh runuser/setpriv
    process cannot start it). Returns (exit code, stderr)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to nobody")
    import importlib
    import pkgutil

    import npusnap_cli
    import npusnap_cli.cli as cli

    # Everything the commands import lazily, loaded now: the checkout may be unreadable to nobody.
    for mod in pkgutil.walk_packages(npusnap_cli.__path__, "npusnap_cli."):
        if not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)

    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.close(r)
            os.dup2(w, 2)
            sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)  # not pytest's capture
            os.environ["HOME"] = "/nonexistent"  # nobody's home (root's is not readable to it)
            os.environ.pop("XDG_CONFIG_HOME", None)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                cli.main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    _, st = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(st), err


def _agent_request(pid: int, line: str) -> str:
    try:
        reply = ag.AgentClient(pid).request(line, check=False)
        return f"{reply.ok} {reply.code}"
    except Exception as e:  # noqa: BLE001
        return f"exc {type(e).__name__}"


def test_agent_refuses_other_users(npusim_daemon, reference, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    env = npusim_daemon.env
    w = start_train(tmp_path, env)
    try:
        for line in ("lock 1000 1000", "status", "backup", "unlock", "renew 100"):
            assert as_user(other_user(), _agent_request, w.pid, line) == f"False {ag.E_DENIED}", line
        assert status(w.pid, env)["state"] == "RUNNING"
        assert_running_intact(w, reference, env)
    finally:
        w.stop()


def test_checkpoint_permissions(pristine):  # noqa: F811
    for p in [pristine, *pristine.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        if p.is_dir():
            assert mode == 0o700, f"{p}: {oct(mode)}"
        else:
            assert mode == 0o600, f"{p}: {oct(mode)}"
            assert not p.is_symlink()


def _hostile(tmp_path: Path, pristine: Path, kind: str) -> Path:  # noqa: F811
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck, symlinks=True)
    m = yaml.safe_load((ck / "manifest.yaml").read_text())
    first = m["files"][0]["path"]
    if kind == "manifest-symlink-shadow":
        (ck / "manifest.yaml").unlink()
        (ck / "manifest.yaml").symlink_to("/etc/shadow")
        return ck
    if kind == "image-symlink-shadow":
        (ck / first).unlink()
        (ck / first).symlink_to("/etc/shadow")
    elif kind == "proc-self-mem":
        m["files"].append({"path": "/proc/self/mem", "size": 1 << 40, "checksum": "0" * 32})
    elif kind == "proc-self-mem-relative":
        (ck / "criu" / "mem").symlink_to("/proc/self/mem")
        m["files"].append({"path": "criu/mem", "size": 1, "checksum": "0" * 32})
    elif kind == "huge-size":
        m["files"][0]["size"] = 10 ** 30
    elif kind == "negative-size":
        m["files"][0]["size"] = -1
    elif kind == "yaml-python-tag":
        (ck / "manifest.yaml").write_text(
            "!!python/object/apply:os.system ['touch " + str(tmp_path / "pwned") + "']\n")
        return ck
    from npusnap_cli.image.format import manifest_text  # resealed: the hostile content is what gets tested

    m.pop("manifest_checksum", None)
    (ck / "manifest.yaml").write_text(manifest_text(m))
    return ck


@pytest.mark.parametrize("kind", ["manifest-symlink-shadow", "image-symlink-shadow", "proc-self-mem",
                                  "proc-self-mem-relative", "huge-size", "negative-size", "yaml-python-tag"])
def test_hostile_directory(kind, pristine, tmp_path):  # noqa: F811
    ck = _hostile(tmp_path, pristine, kind)
    secret = Path("/etc/shadow").read_text(errors="replace") if Path("/etc/shadow").exists() else None
    r = npusnap("verify", ck, timeout=30)
    assert_failed_cleanly(r, {8})
    r2 = npusnap("inspect", ck, "--json", timeout=30)
    assert r2.returncode in (0, 8), r2.stderr
    if r2.returncode == 8:
        assert_failed_cleanly(r2, {8})
    for out in (r.stdout + r.stderr, r2.stdout + r2.stderr):
        if secret:
            for line in secret.splitlines():
                if len(line) > 12:
                    assert line not in out, "a line of /etc/shadow leaked"
    if r2.returncode == 0:
        json.loads(r2.stdout)
    assert not (tmp_path / "pwned").exists(), "the manifest executed something"
