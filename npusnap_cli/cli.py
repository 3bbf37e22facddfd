"""The click application. Commands live one per module under commands/ and are
imported only when invoked, so `npusnap --help` stays instant."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Optional

import click

from . import __version__
from .errors import EXIT_CODES, Interrupted, NpusnapError

# name -> "module:attribute" under npusnap_cli.commands; help text shown without importing.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check:check", "Check that this machine can checkpoint and restore."),
    "checkpoint": ("checkpoint:checkpoint", "Checkpoint a process (lock, backup, dump) into DIR."),
    "restore": ("restore:restore", "Restore a process from a checkpoint directory."),
    "inspect": ("inspect:inspect", "Show what a checkpoint directory holds."),
    "verify": ("verify:verify", "Recompute every checksum of a checkpoint directory."),
    "run": ("run:run", "Run a command with the agent preloaded (exec: same pid)."),
    "attach": ("attach:attach", "Inject the agent into a running process."),
    "status": ("phases:status", "Show a process's phase and device state."),
    "lock": ("phases:lock", "Phase LOCK: quiesce and block device work."),
    "backup": ("phases:backup", "Phase BACKUP: device state to host memory."),
    "dump": ("phases:dump", "Phase DUMP: CRIU-dump a backed-up process."),
    "device-restore": ("phases:device_restore", "Phase DEVICE RESTORE: host memory back to the device."),
    "unlock": ("phases:unlock", "Phase UNLOCK: let device work run again."),
    "recover": ("phases:recover", "Bring a process back to running from any phase."),
    "device": ("device:device", "Manage the npusim software device daemon."),
    "demo": ("demo:demo", "Checkpoint and restore a training loop on npusim, end to end."),
    "list": ("list:list_checkpoints", "List the checkpoints under a directory, valid or not."),
    "prune": ("prune:prune", "Delete all but the newest N valid checkpoints in a directory."),
    "config": ("config:config", "Show the effective configuration and where each value came from."),
    "key": ("key:key", "Generate Ed25519 keys for signing checkpoints."),
    "job": ("job:job", "Checkpoint and restore every rank of a multi-node Slurm job."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(super().list_commands(ctx)))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name][0].split(":")
            cmd: click.Command = getattr(importlib.import_module(f".commands.{module}", __package__), attr)
            return cmd
        return super().get_command(ctx, cmd_name)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """Command names from the table above: completing never imports every command."""
        from click.shell_completion import CompletionItem

        items: list[Any] = [CompletionItem(name, help=COMMANDS[name][1]) for name in sorted(COMMANDS)
                            if name.startswith(incomplete)]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _exit_code_epilog() -> str:
    lines = [f"  {code:>3}  {text}" for code, text in sorted(EXIT_CODES.items())]
    return "\b\nExit codes:\n" + "\n".join(lines)


def _load_config(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> None:
    """Eager: the config files become ctx.default_map before any other option is read."""
    from .config import load
    from .errors import ConfigProblem

    try:
        load(ctx, value)
    except ConfigProblem:
        if not ctx.resilient_parsing:  # shell completion must never fail on a bad file
            raise


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """click's own version option, but the version is this command's whole outcome: once it is
    being printed a Ctrl-C must not report a rollback (exit 130 after the version was out)."""
    if not value or ctx.resilient_parsing:
        return
    _outcome_out()
    click.echo(f"npusnap, version {__version__}")
    ctx.exit()


# Precedence, later wins: /etc/npusnap, ~/.config/npusnap, --config, NPUSNAP_* variables, flags.
@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "NPUSNAP"},
             epilog=_exit_code_epilog())
@click.option("--version", is_flag=True, is_eager=True, expose_value=False, callback=_print_version,
              help="Show the version and exit.")
@click.option("--config", metavar="FILE", envvar="NPUSNAP_CONFIG", is_eager=True, expose_value=False,
              callback=_load_config, type=click.Path(exists=True, dir_okay=False),
              help="Read settings from FILE too, after /etc/npusnap/config.yaml and ~/.config/npusnap/config.yaml.")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def app(ctx: click.Context, verbose: bool) -> None:
    """Checkpoint and restore processes that hold NPU/GPU state."""
    from .output import Terminal

    _tracebacks[0] = verbose  # from the flag, NPUSNAP_VERBOSE or a config file; main() reads it on failure
    ctx.obj = Terminal()


_tracebacks = [False]  # set by the root command once its options are parsed


def _debug_env() -> bool:
    return _tracebacks[0] or any(os.environ.get(v, "") not in ("", "0") for v in ("NPUSNAP_DEBUG", "NPUSNAP_VERBOSE"))


def main(argv: Optional[list[str]] = None) -> Any:
    """Entry point: run the app and turn every failure into one line and an exit code.
    A Ctrl-C while an outcome is being reported ends as one line and 130 too, never as
    death by SIGINT; once the outcome is out, further signals wait for our exit.
    The process's own CLI (argv from sys.argv) then exits at once (exit_now)."""
    try:
        _run(argv)
    except SystemExit as e:
        if argv is None:
            exit_now(e.code)
        raise
    if argv is None:
        exit_now(0)


def exit_now(code: Any) -> None:
    """Exit with SystemExit's code, without the interpreter's finalization: tearing down the
    modules a checkpoint loads (protobuf, yaml, click, ...) costs tens of ms on every command, and
    nothing of ours needs it (the daemon threads are done or moot). Whoever registered an exit
    handler, or profiles or traces us (coverage, cProfile), gets the ordinary exit."""
    import atexit

    if atexit._ncallbacks() or sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


def _run(argv: Optional[list[str]]) -> None:
    import _signal  # type: ignore[import-not-found]

    _interrupted[0] = False
    previous = _signal.getsignal(_signal.SIGINT)
    previous_hook = sys.unraisablehook
    try:
        # Inside the try: a Ctrl-C the moment the handler is in place is already ours. The builtin
        # _signal returns no enum, so no Python code of signal's runs once the handler is set.
        _signal.signal(_signal.SIGINT, _on_sigint)
        sys.unraisablehook = _unraisable
        _main(argv)
    except KeyboardInterrupt:
        _fail(Interrupted())
    finally:
        # The process's own CLI (argv from sys.argv) exits next; a caller in-process gets its handler back.
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN if argv is None else previous)
        sys.unraisablehook = previous_hook
        criustart = sys.modules.get("npusnap_cli.platform.criustart")  # loaded where it started one
        if criustart is not None:
            criustart.drop()  # a CRIU started for a request that never came (a failure, --help)


_interrupted = [False]  # a Ctrl-C arrived: what it broke (a native module's import, say) reports as one


def _on_sigint(signum: int, frame: Any) -> None:
    _interrupted[0] = True
    raise KeyboardInterrupt


def _unraisable(hook: Any) -> None:
    """A Ctrl-C that landed in a finalizer or a weakref callback (an import's module lock, say),
    where Python can only print it and carry on: send it again, to be raised where it can be (by
    whatever SIGINT handler is in place then). In the main thread not from here: its handler would
    run inside this hook and be lost the same way; a timer sends it once the hook has returned."""
    import signal
    import threading

    if hook.exc_type is not None and issubclass(hook.exc_type, KeyboardInterrupt):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGALRM, _send_sigint)
            signal.setitimer(signal.ITIMER_REAL, 0.002)
        else:
            signal.raise_signal(signal.SIGINT)
        return
    sys.__unraisablehook__(hook)


def _send_sigint(signum: int, frame: Any) -> None:
    import signal

    signal.raise_signal(signal.SIGINT)


def _main(argv: Optional[list[str]]) -> Any:
    _tracebacks[0] = any(a in ("-v", "--verbose") for a in (argv or sys.argv[1:]))  # also before parsing
    try:
        # Without standalone mode click returns ctx.exit()'s code instead of exiting.
        rc = app.main(args=argv, prog_name="npusnap", standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        _fail(Interrupted())
    except KeyboardInterrupt:
        _fail(Interrupted())
    except NpusnapError as e:
        _fail(e)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # a bug: one line unless asked for more
        # e.g. an extension module whose init the Ctrl-C cut short (pybind11: ImportError from it;
        # inside a pipeline its own handler raised Interrupted, and the rollback has run)
        if _interrupted[0] or isinstance(e.__context__, (KeyboardInterrupt, Interrupted)):
            _fail(Interrupted())
        if _debug_env():
            raise
        from .output import shown

        click.echo(shown(f"npusnap: internal error: {type(e).__name__}: {e} (rerun with -v for the traceback)"),
                   err=True)
        sys.exit(3)


def _outcome_out() -> None:
    """The outcome is about to be reported: a Ctrl-C from here on waits for our exit. Any
    KeyboardInterrupt still to come was raised before this returned, so before the report."""
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)


def _fail(error: NpusnapError) -> None:
    _outcome_out()  # one line: a second Ctrl-C must not add "interrupted" after the real error
    if _debug_env():
        import traceback

        traceback.print_exc()
    from .output import shown

    click.echo(f"npusnap: error: {shown(error.one_line())}", err=True)  # one line, whatever a path holds
    sys.exit(error.exit_code)
