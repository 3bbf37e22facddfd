from __future__ import annotations

from pathlib import Path

import click

from ..output import Terminal, human_bytes
from . import json_option


@click.command()
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
def verify(term: Terminal, directory: Path) -> None:
    """Recompute every checksum in DIRECTORY; exit non-zero naming the first bad file."""
    from ..image import verify as verify_dir

    m = verify_dir(directory)
    total = sum(f.size for f in m.files)
    if term.json_mode:
        term.data("verify", {"directory": str(directory), "valid": True, "files": len(m.files), "bytes": total})
    else:
        term.success(f"{directory}: {len(m.files)} files, {human_bytes(total)}, all checksums match")
