"""CRIU's own options through npusnap, with real CRIU and real processes: each one reaches
CRIU (the process needs it to dump or restore), is recorded in the manifest, and restore
uses it; without it, the error line names CRIU's reason and npusnap's flag."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import (
    Workload,
    kill_and_wait,
    npusnap,
    npusnap_cmd,
    pid_alive,
    proc_state,
    requires_criu,
)
from tests.pipeline.support import assert_no_checkpoint, one_error_line

from .netlock_support import (
    PROG,
    accept_echo,
    criu_iptables_rules,
    nft_tables,
)

pytestmark = requires_criu


def manifest_options(ck: Path) -> dict:
    r = npusnap("inspect", ck, "--json", check=True)
    return json.loads(r.stdout)["options"]


def count_after(w: Workload, prefix: str, start: int) -> None:
    """Wait until the workload printed a `prefix N` line past the first `start` lines."""
    w.wait_for_line(start + 2)
    tail = w.lines()[start:]
    assert all(line.startswith(prefix) for line in tail if line.strip()), tail


def lock_method() -> str:
    from npusnap_cli.netlock import choose
    from npusnap_cli.platform.criu import find_criu

    return choose(None, find_criu().path)


# ---------------------------------------------------------------- live connections


def test_leave_running_keeps_tcp_connections_alive(peer: socket.socket, tmp_path: Path) -> None:
    port = peer.getsockname()[1]
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none",
                        "--leave-running", "--tcp-established")
            assert r.returncode == 0, r.stderr
            f.write(b"two\n")  # CRIU's lock (repair mode, its nftables table) must be gone
            assert f.readline() == b"echo two\n"
        opts = manifest_options(tmp_path / "ck")
        assert opts["tcp_established"] is True and opts["network_lock"] == lock_method()
        assert "CRIU-" not in nft_tables()
    finally:
        w.stop()


def test_rollback_after_the_dump_unlocks_tcp_connections(peer: socket.socket, tmp_path: Path) -> None:
    from tests.faults.support import PausedCli

    port = peer.getsockname()[1]
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    cli = None
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            cli = PausedCli(["checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--tcp-established"],
                            "after:dump", dict(os.environ))
            cli.proc.send_signal(signal.SIGINT)  # after a successful dump: everything is rolled back
            assert cli.proc.wait(timeout=60) == 130
            assert_no_checkpoint(tmp_path / "ck")
            assert pid_alive(w.pid) and proc_state(w.pid) != "T"
            f.write(b"two\n")
            assert f.readline() == b"echo two\n"
        assert "CRIU-" not in nft_tables()
    finally:
        if cli is not None and cli.proc.poll() is None:
            cli.kill()
        w.stop()


def test_network_lock_that_cannot_work_is_refused_before_anything(peer: socket.socket, tmp_path: Path) -> None:
    from npusnap_cli.netlock import methods
    from npusnap_cli.platform.criu import find_criu

    env = dict(os.environ)
    broken = [m.name for m in methods(find_criu().path) if not m.works]
    if not broken:  # every method works here: npusnap without iptables on its PATH has one that cannot
        env["PATH"] = ":".join(d for d in env.get("PATH", "").split(":")
                               if d and not os.path.exists(os.path.join(d, "iptables-restore")))
        broken = ["iptables"]
    port = peer.getsockname()[1]
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--tcp-established",
                        "--network-lock", broken[0], env=env)
            assert r.returncode == 6, r.stderr
            line = one_error_line(r.stderr)
            assert f"network lock {broken[0]} cannot work here" in line and "--network-lock" in line
            assert_no_checkpoint(tmp_path / "ck")
            f.write(b"two\n")
            assert f.readline() == b"echo two\n"
    finally:
        w.stop()


def test_check_reports_the_network_lock_that_works_and_the_criu_kernel_cache() -> None:
    from npusnap_cli.netlock import methods
    from npusnap_cli.platform.criu import find_criu
    from npusnap_cli.platform.criustart import probes_early
    from npusnap_cli.platform.probe import fs_type

    r = npusnap("check", "--json")
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    cache = checks["criu kernel cache"]  # CRIU keeps its kernel probes on a tmpfs /run only
    assert cache["status"] == ("ok" if fs_type("/run") == "tmpfs" else "info") and "/run is" in cache["detail"], cache
    if fs_type("/run") != "tmpfs":  # whether the probes run while npusnap starts (scripts/criu-patches/0002)
        assert ("while npusnap starts" in cache["detail"]) == probes_early(find_criu().path), cache
    item = checks["network lock"]
    found = methods(find_criu().path)
    working = [m.name for m in found if m.works and m.name != "skip"]
    if working:
        assert item["status"] == "ok" and item["detail"].startswith(working[0])
    else:
        assert item["status"] == "warn"
    for m in found:
        if m.name != "skip" and not m.works:
            assert m.name in item["detail"]  # says what is missing, e.g. iptables-restore


def test_tcp_close_is_recorded_and_restore_uses_it(peer: socket.socket, tmp_path: Path) -> None:
    port = peer.getsockname()[1]
    w = Workload([*PROG, "waitclose", str(port)], tmp_path / "out")
    try:
        peer.settimeout(20)
        conn, _ = peer.accept()
        with conn:
            w.wait_for_line("ready")
            npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--tcp-close", check=True)
            w.proc.wait(timeout=10)
            assert manifest_options(tmp_path / "ck")["tcp_close"] is True
            # No --tcp-close here: CRIU refuses this image without it, so restore took it from the manifest.
            r = npusnap("restore", tmp_path / "ck", "--detach")
            assert r.returncode == 0, r.stderr
            w.wait_for_line("closed")  # restored with the connection closed, as asked
            w.wait_for_line("after 1")
    finally:
        w.stop()


# ---------------------------------------------------------------- the iptables lock


def test_iptables_lock_is_undone_for_a_tree_left_running(iptables: int, peer: socket.socket,
                                                         tmp_path: Path) -> None:
    port = iptables
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--leave-running",
                        "--tcp-established", "--network-lock", "iptables")
            assert r.returncode == 0, r.stderr
            assert "could not" not in r.stderr, r.stderr  # no warning: every rule was found and removed
            assert not criu_iptables_rules(port)
            f.write(b"two\n")  # out of repair mode, no DROP rule: the connection lives
            assert f.readline() == b"echo two\n"
        assert manifest_options(tmp_path / "ck")["network_lock"] == "iptables"
    finally:
        w.stop()
    assert not criu_iptables_rules(port)


def test_iptables_locked_connection_restores_and_runs(iptables: int, peer: socket.socket, tmp_path: Path) -> None:
    port = iptables
    w = Workload([*PROG, "tcp", str(port)], tmp_path / "out")
    try:
        conn, f = accept_echo(peer, w)
        with conn:
            npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--tcp-established",
                    "--network-lock", "iptables", check=True)
            w.proc.wait(timeout=10)
            # The dump keeps the connection locked for its restore: CRIU takes the rules away after it.
            assert criu_iptables_rules(port)
            r = npusnap("restore", tmp_path / "ck", "--detach")
            assert r.returncode == 0, r.stderr
            assert not criu_iptables_rules(port)
            f.write(b"two\n")  # the restored process answers on the same connection
            assert f.readline() == b"echo two\n"
    finally:
        w.stop()
        # A failed restore leaves the dump's rules: take them away so other tests start clean.
        if criu_iptables_rules(port) and (tmp_path / "ck" / "criu").is_dir():
            from npusnap_cli import netlock

            for c in netlock.dumped_connections(tmp_path / "ck" / "criu"):
                netlock._iptables_unlock(c, lambda m: None)
    assert not criu_iptables_rules(port)


def test_tcp_close_restore_of_an_established_dump_leaves_no_lock(iptables: int, peer: socket.socket,
                                                                tmp_path: Path) -> None:
    # CRIU restores the connection closed and unlocks nothing itself (it unlocks only connections
    # it repaired): without npusnap its DROP rules would stay on the machine for good.
    port = iptables
    w = Workload([*PROG, "waitclose", str(port)], tmp_path / "out")
    try:
        peer.settimeout(20)
        conn, _ = peer.accept()
        with conn:
            w.wait_for_line("ready")
            npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--tcp-established",
                    "--network-lock", "iptables", check=True)
            w.proc.wait(timeout=10)
            assert criu_iptables_rules(port)  # kept for the restore
            r = npusnap("restore", tmp_path / "ck", "--detach", "--tcp-close")
            assert r.returncode == 0 and "could not" not in r.stderr, r.stderr
            w.wait_for_line("closed")
            assert not criu_iptables_rules(port)
    finally:
        w.stop()
        if criu_iptables_rules(port):  # this test failed: take CRIU's rules away for the next ones
            from npusnap_cli import netlock

            for c in netlock.dumped_connections(tmp_path / "ck" / "criu"):
                netlock._iptables_unlock(c, lambda m: None)


# ---------------------------------------------------------------- files


def test_ghost_limit_flag_env_and_error_line(tmp_path: Path) -> None:
    size = 3 << 20  # more than CRIU's default limit of 1 MiB
    w = Workload([*PROG, "ghost", str(tmp_path / "ghost"), str(size)], tmp_path / "out")
    try:
        w.wait_for_line("ok 1")
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none")
        assert r.returncode == 7
        line = one_error_line(r.stderr)
        assert "increase limit" in line and "--ghost-limit" in line and "failed with -1" not in line
        assert_no_checkpoint(tmp_path / "ck")
        assert pid_alive(w.pid) and proc_state(w.pid) != "T"
        # The same option from the environment (NPUSNAP_CHECKPOINT_GHOST_LIMIT), as a config key would.
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none",
                    env={**os.environ, "NPUSNAP_CHECKPOINT_GHOST_LIMIT": "4M"})
        assert r.returncode == 0, r.stderr
        w.proc.wait(timeout=10)
        assert manifest_options(tmp_path / "ck")["ghost_limit"] == 4 << 20
        seen = len(w.lines())
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        count_after(w, "ok", seen)  # the deleted file's contents came back
    finally:
        w.stop()


def test_ghost_limit_rejects_a_bad_size(tmp_path: Path) -> None:
    for bad in ("lots", "5G", "-1M"):
        r = npusnap("checkpoint", "1", "-D", tmp_path / "ck", "--ghost-limit", bad)
        assert r.returncode == 2 and "--ghost-limit" in r.stderr and "Traceback" not in r.stderr


def test_link_remap_from_a_config_file_and_error_line(tmp_path: Path) -> None:
    w = Workload([*PROG, "remap", str(tmp_path / "f")], tmp_path / "out")
    try:
        w.wait_for_line("same 1")
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none")
        assert r.returncode == 7
        line = one_error_line(r.stderr)
        assert "Use link-remap option" in line and "--link-remap" in line
        assert_no_checkpoint(tmp_path / "ck")
        config = tmp_path / "config.yaml"
        config.write_text("checkpoint:\n  link_remap: true\n")
        r = npusnap("--config", config, "checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none")
        assert r.returncode == 0, r.stderr
        w.proc.wait(timeout=10)
        assert manifest_options(tmp_path / "ck")["link_remap"] is True
        seen = len(w.lines())
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        count_after(w, "same", seen)  # the open file is the linked inode again
    finally:
        w.stop()


def test_restore_names_a_grown_file_instead_of_killed_by_signal(tmp_path: Path) -> None:
    w = Workload([*PROG, "remap", str(tmp_path / "f")], tmp_path / "out")
    try:
        w.wait_for_line("same 1")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--link-remap", check=True)
        w.proc.wait(timeout=10)
        with open(w.out, "a") as f:
            f.write("grown after the checkpoint\n")
        r = npusnap("restore", tmp_path / "ck", "--detach")
        assert r.returncode == 7
        line = one_error_line(r.stderr)
        assert "has bad size" in line and str(w.out).lstrip("/") in line and "truncate" in line
        assert "killed by signal" not in line
    finally:
        w.stop()


# ---------------------------------------------------------------- sockets


def test_ext_unix_sk_is_recorded_and_restore_uses_it(tmp_path: Path) -> None:
    path = str(tmp_path / "outside.sock")
    outside = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    outside.bind(path)
    outside.settimeout(20)
    w = Workload([*PROG, "dgram", path], tmp_path / "out")
    try:
        w.wait_for_line("sent 1")
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none")
        assert r.returncode == 7
        line = one_error_line(r.stderr)
        assert "External socket is used" in line and "--ext-unix-sk" in line
        assert_no_checkpoint(tmp_path / "ck")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--ext-unix-sk", check=True)
        w.proc.wait(timeout=10)
        assert manifest_options(tmp_path / "ck")["ext_unix_sk"] is True
        outside.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while outside.recv(64):  # what the original sent before it was killed
                pass
        outside.settimeout(20)
        npusnap("restore", tmp_path / "ck", "--detach", check=True)  # CRIU refuses it without ext_unix_sk
        assert outside.recv(64).startswith(b"tick ")  # from the restored process, on the same socket
    finally:
        outside.close()
        w.stop()


def test_external_on_dump_and_inherit_fd_on_restore(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    w = None
    try:
        with open(tmp_path / "out", "wb") as out:
            proc = subprocess.Popen([*PROG, "fd", str(theirs.fileno())], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(theirs.fileno(),))
        w = Workload.__new__(Workload)
        w.out, w.argv, w.proc, w.pid, w.extra_pids = tmp_path / "out", [], proc, proc.pid, []
        theirs.close()
        ours.settimeout(20)
        f = ours.makefile("rwb", buffering=0)
        assert f.readline() == b"ready\n"
        ino = os.stat(f"/proc/{w.pid}/fd/{proc.args[-1]}").st_ino
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none")
        assert r.returncode == 7 and "--ext-unix-sk" in one_error_line(r.stderr)
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--external", f"unix[{ino}]",
                check=True)
        proc.wait(timeout=10)
        assert manifest_options(tmp_path / "ck")["external"] == [f"unix[{ino}]"]
        # Restore hands the tree a new socket in place of the outside one.
        new_ours, new_theirs = socket.socketpair()
        with new_ours, new_theirs:
            fd = new_theirs.fileno()
            r2 = subprocess.run([*npusnap_cmd(), "restore", str(tmp_path / "ck"), "--detach",
                                 "--inherit-fd", f"fd[{fd}]:socket:[{ino}]"],
                                capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                                pass_fds=(fd,))
            assert r2.returncode == 0, r2.stderr
            new_ours.settimeout(20)
            g = new_ours.makefile("rwb", buffering=0)
            g.write(b"again\n")
            assert g.readline() == b"echo again\n"
    finally:
        ours.close()
        if w is not None:
            w.stop()


def test_inherit_fd_must_be_open(tmp_path: Path) -> None:
    r = npusnap("restore", tmp_path, "--inherit-fd", "fd[250]:pipe:[1]")
    assert r.returncode == 2 and "fd 250 is not open" in r.stderr
    r = npusnap("restore", tmp_path, "--inherit-fd", "nonsense")
    assert r.returncode == 2 and "fd[N]:RESOURCE" in r.stderr


# ---------------------------------------------------------------- cgroups, namespaces, inotify


def cgroup_of(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    raise AssertionError(f"{pid} has no {controller} cgroup")


@pytest.fixture
def pids_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A fresh cgroup of the v1 pids controller (the hierarchy CRIU restores by path)."""
    import uuid

    base = Path("/sys/fs/cgroup/pids")
    if not (base / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    cg = base / f"npusnap-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        yield cg
    finally:
        for pid in (cg / "cgroup.procs").read_text().split() if cg.exists() else []:
            kill_and_wait(int(pid))
        with contextlib.suppress(FileNotFoundError):
            cg.rmdir()


def test_manage_cgroups_is_recorded_and_restore_recreates_the_cgroup(pids_cgroup: Path, tmp_path: Path) -> None:
    w = Workload([*PROG, "tick", "-"], tmp_path / "out")
    try:
        (pids_cgroup / "cgroup.procs").write_text(str(w.pid))
        w.wait_for_line("tick 1")
        (pids_cgroup / "pids.max").write_text("77")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--manage-cgroups=full", check=True)
        w.proc.wait(timeout=10)
        assert manifest_options(tmp_path / "ck")["manage_cgroups"] == "full"
        pids_cgroup.rmdir()  # gone with its limit; restore must make it again, as the dump saw it
        seen = len(w.lines())
        # No --manage-cgroups here: restore took the mode from the manifest.
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        count_after(w, "tick", seen)
        assert cgroup_of(w.pid, "pids") == "/" + pids_cgroup.name
        assert (pids_cgroup / "pids.max").read_text().strip() == "77"  # full: the properties too
    finally:
        w.stop()


def test_cgroup_flags_reject_bad_values(tmp_path: Path) -> None:
    for args in (["--manage-cgroups=sometimes"], ["--cgroup-root", "relative/path"]):
        r = npusnap("checkpoint", "1", "-D", tmp_path / "ck", *args)
        assert r.returncode == 2 and args[0].split("=")[0] in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = npusnap("restore", tmp_path, "--join-ns", "nonsense")
    assert r.returncode == 2 and "NS:FILE" in r.stderr


@pytest.fixture
def netns() -> Iterator[Path]:
    import uuid

    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        pytest.skip("needs ip (iproute2) and nsenter (util-linux)")
    name = f"npusnap-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    try:
        yield Path("/run/netns") / name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


def test_join_ns_restores_into_an_existing_network_namespace(netns: Path, tmp_path: Path) -> None:
    w = Workload(["nsenter", f"--net={netns}", *PROG, "tick", "-"], tmp_path / "out")
    try:
        w.wait_for_line("tick 1")
        assert os.stat(f"/proc/{w.pid}/ns/net").st_ino == os.stat(netns).st_ino
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", check=True)
        w.proc.wait(timeout=10)
        seen = len(w.lines())
        npusnap("restore", tmp_path / "ck", "--detach", "--join-ns", f"net:{netns}", check=True)
        count_after(w, "tick", seen)
        assert os.stat(f"/proc/{w.pid}/ns/net").st_ino == os.stat(netns).st_ino  # that one, not a new one
    finally:
        w.stop()


def test_irmap_and_cgroup_options_reach_criu_rpc() -> None:
    # CRIU acts on --force-irmap only for a watch whose file handle cannot be opened, which a test
    # cannot make on demand: what reaches CRIU is checked on the request itself.
    from pycriu import rpc_pb2 as rpc

    from npusnap_cli.criuopts import CriuOptions

    opts = rpc.criu_opts(images_dir_fd=-1)
    CriuOptions(force_irmap=True, irmap_scan_path=("/srv", "/data"), manage_cgroups="full",
                cgroup_root=("/job", "name=zdtmtst:/prefix"), cgroup_yard="/run/yard",
                join_ns=("net:/run/netns/blue", "user:1234,0,0")).apply(opts, rpc)
    assert opts.force_irmap and list(opts.irmap_scan_paths) == ["/srv", "/data"]
    assert opts.manage_cgroups_mode == rpc.FULL and opts.cgroup_yard == "/run/yard"
    assert [(r.ctrl, r.path) for r in opts.cg_root] == [("", "/job"), ("name=zdtmtst", "/prefix")]
    assert [(j.ns, j.ns_file, j.extra_opt) for j in opts.join_ns] == [("net", "/run/netns/blue", ""),
                                                                      ("user", "1234", "0,0")]


def test_force_irmap_checkpoint_restores_its_inotify_watch(tmp_path: Path) -> None:
    watched = tmp_path / "watched"
    watched.mkdir()
    w = Workload([*PROG, "inotify", str(watched)], tmp_path / "out")
    try:
        w.wait_for_line("event 1")
        npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--force-irmap",
                "--irmap-scan-path", tmp_path, check=True)
        w.proc.wait(timeout=10)
        seen = len(w.lines())
        npusnap("restore", tmp_path / "ck", "--detach", check=True)
        # The restored watch still sees DIR/f created. The iteration the dump cut may say "missed":
        # CRIU drops events queued at dump time (its log says so).
        count_after(w, "event", seen + 1)
    finally:
        w.stop()
