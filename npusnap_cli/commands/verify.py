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
    """Recompute every checksum in DIRECTORY, and in its parent chain if it is incremental; exit
    non-zero naming the first bad file."""
    from ..image.chain import verify_chain
    from ..image.format import member_summary
    from ..image.packed import verify as verify_dir
    from ..image.signing import check

    signer = check(directory, trusted_keys, require_signature)
    m = verify_dir(directory)
    chain = [str(p) for p, _ in verify_chain(directory, m, deep=True)]
    total = sum(f.size for f in m.files)
    members = [{k: v for k, v in member_summary(m, e).items() if k in ("pid", "files", "bytes", "checksum")}
               for e in m.members]
    if term.json_mode:
        extra = {"members": members} if m.is_set else {}
        term.data("verify", {"directory": str(directory), "valid": True, "files": len(m.files), "bytes": total,
                             "signed_by": signer, "chain": chain, **extra})
    else:
        signed = f"; signed by trusted key {signer[:16]}..." if signer else ""
        of_set = f" (a set of {len(members)} processes)" if m.is_set else ""
        linked = f"; its chain of {len(chain)} parent checkpoints too" if chain else ""
        term.success(f"{directory}: {len(m.files)} files, {human_bytes(total)}, all checksums match"
                     f"{of_set}{linked}{signed}")
        for s in members:
            term.info(f"  process {s['pid']}: {s['files']} files, {human_bytes(s['bytes'])}, checksum {s['checksum']}")
