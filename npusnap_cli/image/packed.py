"""A checkpoint's packed images (kept in the chunk store, store.py) as a restore and a
verification see them. Most checkpoints have none: then the store's module (2-4 ms of
imports with its codecs, before CRIU's request) is never loaded."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Collection, Iterator, Optional, Sequence

from . import format as fmt
from .format import CRIU_DIR, Manifest, load_manifest, packable, packed_entries


def verify(root: Path, manifest: Optional[Manifest] = None, shallow: Sequence[str] = (),
           later: Collection[str] = (), deep: bool = True, pages: bool = True) -> Manifest:
    """format.verify, and the chunks of packed images: present (deep: and intact, each chunk's
    raw bytes against its digest and the whole image against its checksum). pages=False: a
    chain link's, whose host pages nothing reads, so its packed page images are not looked up."""
    m = manifest or load_manifest(root)
    packed = [e for e in packed_entries(m) if pages or not packable(e.path)]
    if packed:
        from .store import check_chunks

        check_chunks(root, packed, deep)
    return fmt.verify(root, m, shallow, later, chunks_checked=True)


@contextlib.contextmanager
def assembled(root: Path, manifest: Manifest, sub: str = CRIU_DIR, member: str = "") -> Iterator[Path]:
    """The directory CRIU (sub criu/) or the device import (sub device/) reads: root/sub itself,
    or, when images in it were packed, a private directory in the store holding them reassembled
    (store.reassembled: every chunk checked, and the whole file's checksum) beside links to the
    other (verified) images. Removed on exit. member: a set member's subdirectory, the only one
    reassembled."""
    packed = [e for e in packed_entries(manifest)
              if Path(e.path).parts[0] == sub and (not member or Path(e.path).parts[1] == member)]
    if not packed:
        yield root / sub
        return
    from .store import reassembled

    with reassembled(root, packed, sub) as view:
        yield view
