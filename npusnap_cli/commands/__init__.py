"""One module per command; shared option decorators live here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from ..output import Terminal

F = TypeVar("F", bound=Callable[..., Any])


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
