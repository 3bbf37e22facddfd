from __future__ import annotations

from typing import Optional

import click

from ..output import Terminal
from . import criu_option, json_option


@click.command()
@criu_option
@json_option
@click.pass_obj
def check(term: Terminal, criu_path: Optional[str]) -> None:
    """Check that this machine can checkpoint and restore, and say how to fix what is missing."""
    from ..errors import EnvironmentProblem
    from ..platform.probe import probe

    report = probe(criu_path)
    if term.json_mode:
        term.data("check", report.to_dict())
    else:
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("check")
        table.add_column("")
        table.add_column("detail")
        for item in report.items:
            mark = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]",
                    "info": "[dim]-[/dim]"}[item.status]
            detail = item.detail + (f"  [dim](fix: {item.fix})[/dim]" if item.fix and item.status != "ok" else "")
            table.add_row(item.name, mark, detail)
        term.render(table)
    if not report.ok:
        first = next(i for i in report.items if i.status == "fail")
        raise EnvironmentProblem(f"checkpointing cannot work here: {first.name}: {first.detail}", first.fix)
