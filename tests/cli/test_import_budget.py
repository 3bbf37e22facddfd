"""The CLI's import budget: a count of the modules each command path loads, not a timing (every
module costs start-up time on every command). A new import on these paths must fit the budget or
be made lazy; raise a budget only for a module the path really needs from its first line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import Workload, kill_and_wait, requires_criu

# Modules loaded, counted in a fresh interpreter (CPython's own ~30 at start-up included).
# Measured: help 115, checkpoint 169, restore 167; then (#18: the chunk store, --lazy's code,
# shutil/tempfile and socket.py off the restore's path, socket.py off the checkpoint's) 166, 151.
BUDGET = {"help": 118, "checkpoint": 169, "restore": 154}
# A whole real run of a CPU-only process (`--device none --json`), the warm-up thread's imports
# included. Measured: checkpoint 175, restore 175 (195 and 195 while the manifest was block YAML,
# 198 while click's parse of -D imported difflib; before #18's trim: 204, 201). Restore +1:
# image.prefetch, which reads the page images ahead of CRIU. Restore +1 again: platform.criustart,
# which starts CRIU before the rest is imported (the checkpoint's fits in its budget). Restore then
# 162: the chunk store (image.store, image.codecs) only for images it packed, image.packed
# instead; core.lazy only with --lazy; shutil, tempfile (a rendezvous only) and socket.py (CRIU's
# RPC on the builtin _socket) no longer loaded before CRIU's request nor, in a tiny restore, at all.
REAL_BUDGET = {"checkpoint": 177, "restore": 164}
# `npusnap checkpoint --help`, `npusnap restore --help`: the command's options only, none of its
# pipeline. Measured: 135, 128.
HELP_BUDGET = {"checkpoint": 137, "restore": 130}
# Never loaded by a CPU-only checkpoint or restore: the device backends and their platform
# adapters (ctypes bindings), the network lock (only with TCP connections); nor, by a checkpoint,
# signing (only with --sign-key; a restore always checks for a signature).
DEVICE_ONLY = ("npusnap_cli.backends.agent", "npusnap_cli.backends.cuda", "npusnap_cli.backends.direct",
               "npusnap_cli.platform.cuda", "npusnap_cli.platform.agent", "npusnap_cli.platform.simimages",
               "npusnap_cli.netlock", "npusnap_cli.native")
# Never loaded before a command runs: rich (people's output only), yaml (the manifest, loaded on
# a thread while CRIU works), pycriu and protobuf (never on these paths: criurpc.py speaks CRIU's
# RPC), npusim (native).
HEAVY = ("rich", "yaml", "pycriu", "google", "npusim", "secrets", "concurrent")


def _loaded(code: str) -> list[str]:
    prog = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out.splitlines()[-1]))


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY]


def test_help_fits_its_budget() -> None:
    modules = _loaded("from npusnap_cli.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass")
    assert not _heavy(modules)
    assert len(modules) <= BUDGET["help"], f"{len(modules)} modules for --help"


@pytest.mark.parametrize("command", ["checkpoint", "restore"])
def test_a_commands_help_loads_no_pipeline(command: str) -> None:
    modules = _loaded(f"from npusnap_cli.cli import main\ntry: main([{command!r}, '--help'])\nexcept SystemExit: pass")
    assert not _heavy(modules)
    assert not [m for m in modules if m.startswith(("npusnap_cli.core", "npusnap_cli.platform"))]
    assert len(modules) <= HELP_BUDGET[command], f"{len(modules)} modules for {command} --help"


@pytest.mark.parametrize("command", ["checkpoint", "restore"])
def test_a_commands_path_fits_its_budget(command: str) -> None:
    """The command and every module its pipeline imports up front (what runs before CRIU)."""
    modules = _loaded("import click\nfrom npusnap_cli.cli import app\n"
                      f"app.get_command(click.Context(app), {command!r})\n"
                      f"import npusnap_cli.core.{command}, npusnap_cli.core.guardian, npusnap_cli.backends.none\n"
                      "import npusnap_cli.warmup, npusnap_cli.image.checksums")
    assert not _heavy(modules)
    assert len(modules) <= BUDGET[command], f"{len(modules)} modules for {command}"


def test_criu_rpc_and_pstree_load_without_protobuf(tmp_path) -> None:
    """The dump's RPC (our own encoding, criurpc.py) and its pstree.img are read without pycriu
    and without the protobuf runtime (~45 ms of imports)."""
    # pstree.img with one process (pid 7, one thread), behind IMG_COMMON_MAGIC
    entry = b"\x08\x07\x10\x00\x18\x07\x20\x07\x28\x07"
    (tmp_path / "pstree.img").write_bytes((0x54564319).to_bytes(4, "little") + (0x50273030).to_bytes(4, "little")
                                          + len(entry).to_bytes(4, "little") + entry)
    modules = _loaded("from pathlib import Path\nfrom npusnap_cli.platform.criu import rpc_messages\n"
                      "from npusnap_cli.platform.criuimages import dumped_tree\n"
                      "rpc = rpc_messages(); rpc.criu_req(type=rpc.DUMP, opts=rpc.criu_opts(images_dir_fd=-1))"
                      ".SerializeToString()\nrpc.criu_resp.FromString(b'\\x08\\x01\\x10\\x01')\n"
                      f"assert dumped_tree(Path({str(tmp_path)!r})) == [(7, 0, 1)]")
    assert "npusnap_cli.platform.criurpc" in modules and not _heavy(modules)


@requires_criu
def test_checkpoint_and_restore_never_import_protobuf(tmp_path) -> None:
    """End to end, on a real process and a real CRIU: nothing on either command's path (its
    warm-up thread included) imports protobuf or pycriu."""
    w = Workload(["sleep", "1000"], tmp_path / "out")
    try:
        # --leave-running too: whether CRIU locked a TCP connection is read from files.img directly.
        for args in (["checkpoint", w.pid, "-D", tmp_path / "lr", "--device", "none", "--leave-running", "--json"],
                     ["checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "none", "--json"],
                     ["restore", tmp_path / "ck", "--detach", "--json"]):
            r = subprocess.run([sys.executable, "-X", "importtime", "-m", "npusnap_cli", *map(str, args)],
                               capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stderr
            imported = [line.rpartition("|")[2].strip() for line in r.stderr.splitlines()
                        if line.startswith("import time:") and "imported package" not in line]
            assert "npusnap_cli.platform.criurpc" in imported
            # nor yaml: the manifest is written and read as JSON lines (image/format.py: flow_yaml)
            assert not [m for m in imported if m.split(".")[0] in ("google", "pycriu", "secrets", "rich", "yaml")], \
                args[0]
            assert not [m for m in imported if m in DEVICE_ONLY], args[0]
            assert "difflib" not in imported, args[0]  # click's suggestions for an option it took as long
            assert args[0] == "restore" or "npusnap_cli.image.signing" not in imported
            # nor the chunk store: only with --dedup/--compress, or a restore of what they packed (image/packed.py)
            assert "npusnap_cli.image.store" not in imported, args[0]
            assert "npusnap_cli.core.lazy" not in imported, args[0]  # only with --lazy
            assert len(imported) <= REAL_BUDGET[args[0]], f"{len(imported)} modules for a real {args[0]}"
            if args[0] == "checkpoint" and "--leave-running" not in args:
                w.proc.wait(timeout=10)  # killed by the checkpoint: its pid is free for the restore
    finally:
        w.proc.poll()
        kill_and_wait(w.pid)


def test_short_options_parse_without_difflib() -> None:
    """`-D DIR`, `-d` are taken as the short options they are at once: click would first try each
    as a long option and import difflib to suggest close names for the error it then drops. The
    parse and its errors stay click's: a misspelled long option still gets its suggestion."""
    prog = ("import sys, click\nfrom npusnap_cli.cli import app\n"
            "def parse(*args):\n"
            "    ctx = app.make_context('npusnap', list(args))\n"
            "    return app.get_command(ctx, args[0]).make_context(args[0], list(args[1:]), parent=ctx).params\n"
            "p = parse('checkpoint', '7', '-D', 'ck', '--device', 'none')\n"
            "assert str(p['directory']) == 'ck' and p['pids'] == ('7',) and p['device'] == 'none', p\n"
            "assert str(parse('checkpoint', '7', '-Dck')['directory']) == 'ck'\n"
            "assert parse('restore', 'ck', '-d')['detach'] is True\n"
            "assert 'difflib' not in sys.modules\n"
            "for args, said in ((('checkpoint', '7', '-D', 'ck', '-q'), \"No such option '-q'\"),\n"
            "                   (('restore', 'ck', '--detatch'), \"Did you mean '--detach'?\")):\n"
            "    try:\n        parse(*args)\n        raise AssertionError(args)\n"
            "    except click.UsageError as e:\n        assert said in e.format_message(), e.format_message()\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("handler", [False, True])
def test_the_cli_exits_without_finalization_unless_something_needs_it(handler: bool) -> None:
    """The CLI's own process ends with os._exit (its output flushed, its exit code kept); an
    exit handler someone registered (coverage does) still runs: then it exits the ordinary way."""
    prog = ("import atexit, sys\n"
            + ("atexit.register(lambda: print('handler ran'))\n" if handler else "")
            + "sys.argv = ['npusnap', 'verify', '/nonexistent/checkpoint']\n"
              "class Finalized:\n    def __del__(self): print('finalized', flush=True)\n"
              "f = Finalized()\n"  # deleted at interpreter finalization only
              "from npusnap_cli.cli import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
    assert r.returncode == 8 and "not a checkpoint directory" in r.stderr, r.stderr
    assert ("handler ran" in r.stdout) == handler
    assert ("finalized" in r.stdout) == handler


def test_warmup_imports_only_once_the_command_waits() -> None:
    """warmup.later() names modules; they are imported on a thread only at idle() (where the command
    starts waiting on CRIU), never while the main thread still imports what comes before."""
    prog = ("import sys, time\nimport npusnap_cli.warmup as warmup\n"
            "warmup.later('difflib')\ntime.sleep(0.05)\nassert 'difflib' not in sys.modules\n"
            "t = warmup.idle()\nassert t is not None\nt.join(30)\nassert 'difflib' in sys.modules\n"
            "assert warmup.idle() is None\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
