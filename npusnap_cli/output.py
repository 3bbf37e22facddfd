"""All output goes through one Terminal: data to stdout, messages to stderr.

`--json` turns stdout into one JSON document per command (with a schema
version); people get rich rendering. NO_COLOR is honoured by rich, and
progress bars appear only when stderr is a terminal and JSON is off.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress

    from .core.progress import Event, Progress

JSON_SCHEMA_VERSION = 1


class Terminal:
    def __init__(self, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self._out: Optional[Console] = None
        self._err: Optional[Console] = None
        self.warnings: list[str] = []  # what the pipeline warned about, for the --json document

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

    def closing_modules(self) -> tuple[str, ...]:
        """What the human view's closing lines import (none with --json), for warmup.later()."""
        return () if self.json_mode else ("rich.console", "rich.markup")

    # messages (stderr), each one line whatever bytes the paths in it hold
    def info(self, message: str) -> None:
        if not self.json_mode:
            self.err.print(shown(message), markup=False)

    def success(self, message: str) -> None:
        if not self.json_mode:
            self.err.print(f"[green]✓[/green] {_escape(shown(message))}")

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {_escape(shown(message))}")

    def error(self, message: str) -> None:
        self.err.print(f"[red]error:[/red] {_escape(shown(message))}")

    @contextlib.contextmanager
    def reporter(self, live: bool = True) -> Iterator[Progress]:
        """The pipeline's progress callback. On a terminal each phase is a live line, with bytes
        and rate where the phase fills a directory of a known size (BytesExpected); scripts get
        no progress. Warnings go to stderr, and with --json into the document as well
        (self.warnings). live=False when the terminal is a shell job's too (--shell-job): a live
        display hides the cursor and redraws lines over what the job writes, and after a restore
        the job owns the terminal; only plain messages go there then."""
        from .core.progress import BytesExpected, Level, Message, PhaseFinished, PhaseStarted

        with self.progress(live) as progress:
            watch: Optional[_Watch] = None

            def report(event: Event) -> None:
                nonlocal watch
                if isinstance(event, Message):
                    if event.level == Level.WARNING:
                        self.warnings.append(event.text)
                        self.warn(event.text)
                    else:
                        self.info(event.text)
                elif isinstance(event, PhaseStarted):
                    if watch is not None:
                        watch.stop()
                    watch = _Watch(progress, event.label) if progress is not None else None
                elif isinstance(event, PhaseFinished):
                    if watch is not None and watch.name == event.label:
                        watch.stop()
                        watch = None
                elif isinstance(event, BytesExpected):
                    if watch is not None and watch.name == event.label:
                        watch.follow(event.directory, event.total)

            try:
                yield report
            finally:
                if watch is not None:
                    watch.stop()

    # data (stdout)
    def data(self, kind: str, payload: dict[str, Any]) -> None:
        """Emit a command's result as JSON: `{"schema": N, "kind": ..., ...}`."""
        doc = {"schema": JSON_SCHEMA_VERSION, "kind": kind, **payload}
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        sys.stdout.flush()

    def render(self, renderable: Any) -> None:
        self.out.print(renderable)

    @contextlib.contextmanager
    def progress(self, live: bool = True) -> Iterator[Optional[RichProgress]]:
        """A rich Progress on stderr when a person is watching, else None."""
        if self.json_mode or not live or not sys.stderr.isatty():
            yield None
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description:<15}"),
            BarColumn(),
            TextColumn("{task.fields[bytes]}"),  # filled in only for phases that move data
            TimeElapsedColumn(),
            console=self.err,
            transient=False,
        ) as progress:
            yield progress


class _Watch:
    """One phase's progress line; with a directory to follow, the bytes written into it."""

    def __init__(self, progress: "RichProgress", name: str) -> None:
        self.progress = progress
        self.name = name
        self.task = progress.add_task(name, total=None, bytes="")
        self.stopped = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def follow(self, directory: Path, total: int) -> None:
        if total:
            self.progress.update(self.task, total=total)
        self.thread = threading.Thread(target=self._poll, args=(directory,), daemon=True)
        self.thread.start()

    def _poll(self, directory: Path) -> None:
        while not self.stopped.wait(0.2):
            self._show(_tree_size(directory))

    def _show(self, done: int) -> None:
        task = self.progress.tasks[self.task]
        rate = f", {human_bytes(task.speed)}/s" if task.speed else ""
        self.progress.update(self.task, completed=done, bytes=f"{human_bytes(done)}{rate}")

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        if self.thread is None:
            self.progress.update(self.task, total=1, completed=1)
            return
        task = self.progress.tasks[self.task]
        done = int(task.completed)
        rate = f", {human_bytes(done / task.elapsed)}/s" if task.elapsed else ""
        self.progress.update(self.task, total=done or 1, completed=done or 1, bytes=f"{human_bytes(done)}{rate}")


def _tree_size(directory: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(directory):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def shown(value: object) -> str:
    """Text (a path, a name, a message) as one printable line: a control character or
    an undecodable byte (a surrogate escape from the file system) shows as \\n, \\xff, ...
    The one place that makes what came from a workload or a checkpoint (argv, comm, paths,
    names) safe for a terminal: nothing printed can move the cursor or forge a line."""
    text = os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(shown(text))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
