from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..numbers import Count
from ..output import Terminal, human_bytes
from . import json_option


@click.command()
@click.option("--steps", type=Count(4, 10000), default=30, show_default=True, help="Training steps.")
@click.option("--checkpoint-at", type=Count(1), default=10, show_default=True,
              help="Step at which to checkpoint.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Where to keep the checkpoint and logs (default: a new temporary directory).")
@json_option
@click.pass_obj
def demo(term: Terminal, steps: int, checkpoint_at: int, workdir: Optional[Path]) -> None:
    """Checkpoint a training loop on the software NPU mid-run, restart the device,
    restore it, and show it finishes exactly as an uninterrupted run."""
    from ..core.demo import run_demo
    from ..errors import NpusnapError

    if checkpoint_at >= steps:
        raise click.BadParameter("must be smaller than --steps", param_hint="--checkpoint-at")
    r = run_demo(steps, checkpoint_at, workdir, say=term.info)
    if term.json_mode:
        term.data("demo", {"workdir": str(r.workdir), "identical": r.identical, "final": r.final_line,
                           "device_bytes": r.device_bytes, "image_bytes": r.image_bytes,
                           "checkpoint_phases": [p.__dict__ for p in r.checkpoint_phases],
                           "restore_phases": [p.__dict__ for p in r.restore_phases]})
    else:
        from rich.table import Table

        table = Table("phase", "seconds", "bytes", "rate", title="per-phase timings", box=None,
                      header_style="bold")
        for label, phases in (("checkpoint", r.checkpoint_phases), ("restore", r.restore_phases)):
            for p in phases:
                rate = f"{human_bytes(p.bytes / p.seconds)}/s" if p.bytes and p.seconds > 0 else ""
                table.add_row(f"{label}: {p.name}", f"{p.seconds:.3f}", human_bytes(p.bytes) if p.bytes else "",
                              rate)
        term.render(table)
        term.render(f"device memory checkpointed: {human_bytes(r.device_bytes)}; "
                    f"checkpoint on disk: {human_bytes(r.image_bytes)} in {r.workdir}")
        term.render(f"final: {r.final_line}")
    if not r.identical:
        raise NpusnapError("the restored run's output differs from the uninterrupted run's",
                           f"compare {r.workdir}/train.out with a fresh run")
    if not term.json_mode:
        term.success("the restored run finished exactly as the uninterrupted run did")
