"""The manifest's text: YAML whose every top-level value is one line of JSON (read back with json,
without PyYAML's import), that any YAML reader reads as the same data; block-style YAML
manifests (older npusnap, or edited) are still read, through yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from npusnap_cli.errors import ImageInvalid
from npusnap_cli.image.format import (
    MANIFEST,
    MANIFEST_CHECKSUM_KEY,
    DeviceState,
    FileEntry,
    Manifest,
    PhaseTiming,
    ProcessEntry,
    flow_yaml,
    load_manifest,
    manifest_text,
    seal_manifest_text,
)


def _manifest() -> Manifest:
    return Manifest(pid=4242, created="2026-12-04T20:00:00.000001+00:00", host="node-1", kernel="6.18.0",
                    npusnap_version="0.1.0", criu_version="4.2.1",
                    command=["python3", "-c", "print('a: b')\n\t\"q\" # not a comment", "caf\u00e9", "\udcff", ""],
                    options={"shell_job": False, "ghost_limit": None, "external": [], "live": {"downtime_s": 1e-05}},
                    processes=[ProcessEntry(4242, 1, "python3", 2)],
                    device=DeviceState(),
                    phases=[PhaseTiming("lock", 3.2e-05), PhaseTiming("dump", 0.25, 1 << 20),
                            PhaseTiming("seal", 1e16, 0)],
                    files=[FileEntry("criu/pages-1.img", 1 << 20, "ab" * 16), FileEntry("criu/core-4242.img", 0, "")])


def _write(root: Path, text: str) -> Path:
    root.mkdir()
    (root / MANIFEST).write_text(text)
    return root


def test_one_json_value_a_line_read_back_without_yaml(tmp_path: Path) -> None:
    m = _manifest()
    text = manifest_text(m.to_dict())
    lines = text.rstrip("\n").split("\n")
    assert [line.partition(": ")[0] for line in lines] == [*m.to_dict(), MANIFEST_CHECKSUM_KEY]
    assert text.isascii()  # JSON's escapes: no byte YAML or a line split could take for a break
    root = _write(tmp_path / "ck", text)
    prog = ("import sys\nfrom pathlib import Path\nfrom npusnap_cli.image.format import load_manifest\n"
            f"m = load_manifest(Path({str(root)!r}))\nassert m.pid == 4242 and m.phases[0].seconds == 3.2e-05\n"
            "assert 'yaml' not in sys.modules, 'yaml imported'\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert load_manifest(root) == m


def test_any_yaml_reader_reads_the_same_data() -> None:
    """Floats keep their type in YAML 1.1 too (1.0e-05, never 1e-05, which PyYAML reads as text)."""
    d = _manifest().to_dict()
    read = yaml.safe_load(manifest_text(d))
    read.pop(MANIFEST_CHECKSUM_KEY)
    assert read == d
    assert [p["seconds"] for p in read["phases"]] == [3.2e-05, 0.25, 1e16]
    assert read["options"]["live"]["downtime_s"] == 1e-05


def test_a_block_yaml_manifest_is_still_read(tmp_path: Path) -> None:
    """What npusnap wrote before (yaml.dump's block style), and a manifest edited and resealed.
    (yaml.dump wrote a lone surrogate, an undecodable byte of a command line, as an escape that
    PyYAML cannot read back; JSON's escape reads back.)"""
    m = _manifest()
    m.command = [a for a in m.command if a != "\udcff"]
    body = yaml.dump(m.to_dict(), Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=False)
    assert load_manifest(_write(tmp_path / "old", seal_manifest_text(body))) == m
    # one line YAML reads otherwise than JSON would (a 'yes' is YAML 1.1's true): all of it goes to yaml
    lines = manifest_text(m.to_dict()).rstrip("\n").split("\n")[:-1]
    edited = seal_manifest_text("\n".join(["extra: yes", *lines]) + "\n")
    assert load_manifest(_write(tmp_path / "edited", edited)) == m


def test_edits_and_bad_text_are_refused(tmp_path: Path) -> None:
    text = manifest_text(_manifest().to_dict())
    with pytest.raises(ImageInvalid, match="edited or corrupted"):
        load_manifest(_write(tmp_path / "a", text.replace('"node-1"', '"node-2"')))
    with pytest.raises(ImageInvalid, match="not valid YAML"):
        load_manifest(_write(tmp_path / "b", seal_manifest_text("pid: [1, 2\nfiles: {")))
    with pytest.raises(ImageInvalid, match="not a mapping"):
        load_manifest(_write(tmp_path / "c", ""))


def test_what_json_cannot_carry_is_refused_when_written() -> None:
    """Keys that are not text would come back as text; nan has no JSON."""
    with pytest.raises(TypeError):
        flow_yaml({"options": {1: "x"}})
    with pytest.raises(ValueError):
        flow_yaml({"phases": [float("nan")]})
    with pytest.raises(ValueError):
        flow_yaml({"not a key": 1})
