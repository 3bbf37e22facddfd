from __future__ import annotations

from pathlib import Path

import click

from ..output import Terminal, human_bytes
from . import json_option, trust_options


@click.command()
@click.argument("directory", type=click.Path(path_type=Path))
@trust_options
@json_option
@click.pass_obj
def verify(term: Terminal, directory: Path, require_signature: bool, trusted_keys: tuple[Path, ...]) -> None:
    """Recompute every checksum in DIRECTORY; exit non-zero naming the first bad file."""
    from ..image.format import verify as verify_dir
    from ..image.signing import check

    signer = check(directory, trusted_keys, require_signature)
    m = verify_dir(directory)
    total = sum(f.size for f in m.files)
    if term.json_mode:
        term.data("verify", {"directory": str(directory), "valid": True, "files": len(m.files), "bytes": total,
                             "signed_by": signer})
    else:
        signed = f"; signed by trusted key {signer[:16]}..." if signer else ""
        term.success(f"{directory}: {len(m.files)} files, {human_bytes(total)}, all checksums match{signed}")
