from __future__ import annotations

from typing import Any

import click

from ..output import Terminal
from . import json_option


@click.group()
def config() -> None:
    """Inspect npusnap's configuration.

    \b
    Sources, later wins:
      /etc/npusnap/config.yaml
      $XDG_CONFIG_HOME/npusnap/config.yaml (default ~/.config/npusnap/config.yaml)
      npusnap --config FILE (or NPUSNAP_CONFIG=FILE)
      NPUSNAP_<COMMAND>_<OPTION> environment variables (NPUSNAP_CRIU for --criu)
      flags on the command line
    """


@config.command()
@json_option
@click.pass_context
def show(ctx: click.Context) -> None:
    """Print every setting's effective value and where it came from
    (default, a config file, an environment variable, or a flag)."""
    from ..config import META_KEY, Config, effective

    term: Terminal = ctx.obj
    root = ctx.find_root()
    cfg: Config = root.meta.get(META_KEY) or Config()
    settings = effective(root, warn=term.warn)
    if term.json_mode:
        term.data("config", {
            "files": [{"path": str(f.path), "origin": f.origin, "loaded": f.loaded} for f in cfg.files],
            "settings": [s.__dict__ for s in settings],
        })
        return
    from rich.table import Table
    from rich.text import Text

    for f in cfg.files:
        term.render(Text(f"config file ({f.origin}): {f.path}" + ("" if f.loaded else " (absent)"),
                         style="" if f.loaded else "dim"))
    table = Table(box=None, header_style="bold")
    for column in ("key", "value", "source"):
        table.add_column(column, overflow="fold")
    for s in settings:
        where = {"default": "default", "flag": "flag"}.get(s.source) or f"{s.source} {s.origin}"
        table.add_row(Text(s.key), Text(_show(s.value)), Text(where, style="" if s.source != "default" else "dim"))
    term.render(table)


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
