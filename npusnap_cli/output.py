"""All output goes through one Terminal: data to stdout, messages to stderr.

`--json` turns stdout into one JSON document per command (with a schema
version); people get rich rendering. NO_COLOR is honoured by rich, and
progress bars appear only when stderr is a terminal and JSON is off.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

JSON_SCHEMA_VERSION = 1


class Terminal:
    def __init__(self, json_mode: bool = False, verbose: bool = False) -> None:
        self.json_mode = json_mode
        self.verbose = verbose
        self._out: Optional[Console] = None
        self._err: Optional[Console] = None

    @property
    def out(self) -> Console:
        if self._out is None:
            from rich.console import Console

            self._out = Console(highlight=False)
        return self._out

    @property
    def err(self) -> Console:
        if self._err is None:
            from rich.console import Console

            self._err = Console(stderr=True, highlight=False, soft_wrap=True)
        return self._err

    # messages (stderr)
    def info(self, message: str) -> None:
        if not self.json_mode:
            self.err.print(message, markup=False)

    def success(self, message: str) -> None:
        if not self.json_mode:
            self.err.print(f"[green]✓[/green] {_escape(message)}")

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {_escape(message)}")

    def error(self, message: str) -> None:
        self.err.print(f"[red]error:[/red] {_escape(message)}")

    def debug(self, message: str) -> None:
        if self.verbose:
            self.err.print(f"[dim]{_escape(message)}[/dim]")

    def reporter(self) -> "Callable[[str, str], None]":
        """The pipeline's progress callback: phases and warnings on stderr."""

        def report(event: str, message: str) -> None:
            if event == "warn":
                self.warn(message)
            elif event == "phase":
                if sys.stderr.isatty():  # progress is for people watching; scripts get results
                    self.info(f"→ {message}")
            else:
                self.info(message)

        return report

    # data (stdout)
    def data(self, kind: str, payload: dict[str, Any]) -> None:
        """Emit a command's result as JSON: `{"schema": N, "kind": ..., ...}`."""
        doc = {"schema": JSON_SCHEMA_VERSION, "kind": kind, **payload}
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        sys.stdout.flush()

    def render(self, renderable: Any) -> None:
        self.out.print(renderable)

    @contextlib.contextmanager
    def progress(self) -> Iterator[Optional[Progress]]:
        """A rich Progress on stderr when a person is watching, else None."""
        if self.json_mode or not sys.stderr.isatty():
            yield None
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=False,
        ) as progress:
            yield progress


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
