"""One module per command; shared option decorators live here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from ..output import Terminal

F = TypeVar("F", bound=Callable[..., Any])


class Command(click.Command):
    """A command whose short options (`-D DIR`) are taken as short options at once. click tries
    every option as a long one first, and its failed try imports difflib to suggest close long
    names, an error it then drops: a few ms on every checkpoint and restore. Same parse, same
    errors (an unknown short option is still reported by click's own short-option code)."""

    def make_parser(self, ctx: click.Context) -> Any:
        parser = super().make_parser(ctx)
        process, short = getattr(parser, "_process_opts", None), getattr(parser, "_match_short_opt", None)
        long_names, prefixes = getattr(parser, "_long_opt", None), getattr(parser, "_opt_prefixes", None)
        if not (callable(process) and callable(short) and isinstance(long_names, dict)
                and isinstance(prefixes, set)) or ctx.token_normalize_func is not None:
            return parser  # a click whose parser differs: its own way

        def process_opts(arg: str, state: Any) -> None:
            # click's own order: a long option of that name first ("-foo" may be one), then,
            # unless the prefix is a long one ("--"), the short options
            if arg.split("=", 1)[0] not in long_names and arg[:2] not in prefixes:
                short(arg, state)
                return
            process(arg, state)

        parser._process_opts = process_opts  # type: ignore[method-assign]
        return parser


def json_option(f: F) -> F:
    """`--json`: print one JSON document on stdout instead of the human view."""

    def set_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            term = ctx.find_object(Terminal)  # the root group put it on ctx.obj
            if term is not None:
                term.json_mode = True
        return value

    return click.option("--json", "json_output", is_flag=True, expose_value=False, is_eager=True,
                        callback=set_json, help="Print the result as JSON on stdout.")(f)


def criu_option(f: F) -> F:
    return click.option("--criu", "criu_path", metavar="PATH", envvar="NPUSNAP_CRIU",
                        help="CRIU binary to use (default: the first CRIU >= 4.1 on PATH).")(f)


pid_argument = click.argument("pid", metavar="PID")


def trust_options(f: F) -> F:
    """`--require-signature` and `--trusted-key` (verify, restore): see signing.py."""
    f = click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(path_type=Path),
                     metavar="FILE", help="An Ed25519 public key (PEM) whose signatures are trusted; repeatable. "
                     "A present signature is checked against these.")(f)
    return click.option("--require-signature", is_flag=True,
                        help="Refuse a checkpoint not signed by a --trusted-key.")(f)
