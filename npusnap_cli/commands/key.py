from __future__ import annotations

from pathlib import Path

import click

from ..output import Terminal
from . import json_option


@click.group()
def key() -> None:
    """Ed25519 keys for signing checkpoints (checkpoint --sign-key, verify/restore --trusted-key)."""


@key.command()
@click.argument("private", type=click.Path(path_type=Path))
@click.argument("public", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
def generate(term: Terminal, private: Path, public: Path) -> None:
    """Write a new key pair: PRIVATE (PEM, 0600) and PUBLIC (PEM). Neither may exist yet."""
    from ..image.signing import generate_keypair

    fingerprint = generate_keypair(private, public)
    if term.json_mode:
        term.data("key", {"private": str(private), "public": str(public), "public_key": fingerprint})
    else:
        term.success(f"wrote {private} (keep it secret) and {public} (key {fingerprint[:16]}...)")
