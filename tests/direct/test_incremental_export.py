"""Incremental exports on a real daemon (npusim's dirty tracking, export.h format 2): each write
path marks exactly the chunks it wrote; a chain imports bit-exact; after an import only that
export (or a later one) is a base; a reference into a missing link is refused."""

from __future__ import annotations

import npusim
import pytest

MiB = 1 << 20
TOTAL = 16 * MiB


def _export(c, sock, d, parent=None) -> dict:  # type: ignore[no-untyped-def]
    d.mkdir()
    c.call("lock")
    out = npusim.export_client(sock, c.pid, d, None if parent is None else parent)
    c.call("unlock")
    return out


def _expected(out: dict) -> list[tuple[str, int, str]]:
    return [(f["path"], f["size"], f["checksum"]) for f in out["files"]]


# (a Python statement run in the client over allocs = [(device, a, size), (device, b, size)],
#  the 1 MiB chunks it writes)
WRITES = [
    ("npusim.memcpy_h2d(allocs[0][1] + 3 * 2**20 + 10, np.ones(100, np.uint8))", 1),
    ("npusim.memcpy_h2d(allocs[0][1] + 4 * 2**20 - 1, np.ones(2, np.uint8))", 2),  # across a boundary
    ("npusim.memset(allocs[1][1], 7, 2 * 2**20 + 1)", 3),
    ("npusim.memcpy_d2d(allocs[1][1] + 5 * 2**20, allocs[0][1], 2**20)", 1),  # the source stays clean
    ("npusim.launch_fill(allocs[0][1] + 7 * 2**20, 1024, 2.0)", 1),
    ("npusim.launch_copy(allocs[1][1] + 7 * 2**20 + 4096, allocs[0][1], 4096)", 1),
    ("npusim.launch_axpy(1024, 0.5, allocs[0][1], allocs[1][1] + 6 * 2**20)", 1),
    ("npusim.memcpy_d2h(np.empty(2**20, np.uint8), allocs[0][1])", 0),  # a read writes nothing
]


def test_each_write_path_marks_its_chunks_and_the_chain_imports_bit_exact(npusim_daemon, client, tmp_path):
    sock = npusim_daemon.socket
    c = client()
    c.call("alloc", 0, 8 * MiB, "random", 1)
    c.call("alloc", 0, 8 * MiB, "random", 2)
    links = [tmp_path / "l0"]
    full = _export(c, sock, links[0])
    assert full["referenced_bytes"] == 0 and full["nonzero_bytes"] == TOTAL
    for i, (stmt, chunks) in enumerate(WRITES, 1):
        c.call("py", stmt)
        links.append(tmp_path / f"l{i}")
        out = _export(c, sock, links[-1], links[-2])
        assert out["referenced_bytes"] == TOTAL - chunks * MiB, (stmt, out)
        assert out["written_bytes"] < (chunks + 1) * MiB, (stmt, out)
    before = c.call("contents")

    # The last link, with its whole chain, back into re-created allocations.
    c.call("lock")
    last = tmp_path / "last"
    last.mkdir()
    out = npusim.export_client(sock, c.pid, last, links[-1])
    assert out["referenced_bytes"] == TOTAL
    c.call("backup_external")
    c.call("restore")
    chain = [links[-1 - k] for k in range(len(links))]  # parent first
    with pytest.raises(npusim.AclError, match="references link"):  # a link short: refused, nothing used
        npusim.import_client(sock, c.pid, last, _expected(out), chain[:-1])
    back = npusim.import_client(sock, c.pid, last, _expected(out), chain)
    assert back["referenced_bytes"] == TOTAL
    c.call("unlock")
    assert c.call("contents") == before

    # After that import only its export is a base: against it nothing is new, against an older
    # link (whose epoch means nothing for the re-created memory) everything is.
    again = _export(c, sock, tmp_path / "again", last)
    assert again["referenced_bytes"] == TOTAL
    older = _export(c, sock, tmp_path / "older", links[-1])
    assert older["referenced_bytes"] == 0 and older["nonzero_bytes"] == TOTAL


def test_a_flipped_byte_in_an_ancestor_names_it(npusim_daemon, client, tmp_path):
    sock = npusim_daemon.socket
    c = client()
    c.call("alloc", 0, 4 * MiB, "random", 3)
    first = _export(c, sock, tmp_path / "a")
    c.call("py", "npusim.memset(allocs[0][1], 1, 2**20)")
    c.call("lock")
    (tmp_path / "b").mkdir()
    out = npusim.export_client(sock, c.pid, tmp_path / "b", tmp_path / "a")
    assert out["referenced_bytes"] == 3 * MiB and first["files"][0]["path"] == "dev0.img"
    img = tmp_path / "a" / "dev0.img"
    data = bytearray(img.read_bytes())
    data[64 + 2 * MiB + 5] ^= 0x80  # chunk 2, which b references
    img.write_bytes(bytes(data))
    c.call("backup_external")
    c.call("restore")
    with pytest.raises(npusim.AclError, match=f"{tmp_path}/a/dev0.img: checksum mismatch in a chunk"):
        npusim.import_client(sock, c.pid, tmp_path / "b", _expected(out), [tmp_path / "a"])
