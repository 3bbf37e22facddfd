"""Signatures catch tampering that checksums cannot: an attacker (a real second user who can
write the checkpoint, e.g. on shared storage) edits an image and recomputes every checksum.
Plain verify passes that; --require-signature with the signer's key refuses it, and so it
refuses an unsigned checkpoint and one signed by another key."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from npusnap_cli.image.format import checksum_file, manifest_text  # imported here: the attacker cannot read /root
from tests.faults.support import assert_failed_cleanly
from tests.helpers import Workload, criu_works, npusnap
from tests.users import as_user, other_user

pytestmark = pytest.mark.criu

LOOP = "import time\ni = 0\nwhile True:\n    print(i, flush=True); i += 1; time.sleep(0.05)\n"


def _keypair(where: Path, name: str) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private, public = where / f"{name}.pem", where / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    if not criu_works():
        pytest.skip("CRIU does not work here")
    base = tmp_path_factory.mktemp("signing")
    private, public = base / "ops.pem", base / "ops.pub"
    r = npusnap("key", "generate", private, public, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.stat(private).st_mode & 0o777 == 0o600
    assert npusnap("key", "generate", private, base / "x.pub", timeout=60).returncode == 12  # never overwrites
    _, other_public = _keypair(base, "other")
    w = Workload([sys.executable, "-u", "-c", LOOP], base / "w.out")
    try:
        w.wait_for_line(3)
        r = npusnap("checkpoint", w.pid, "-D", base / "ck", "--device", "none", "--leave-running",
                    "--sign-key", private, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        w.stop()
    assert (base / "ck" / "manifest.sig").is_file()
    yield base / "ck", public, other_public


def _tamper(ck: str) -> None:
    """As the attacker: flip a byte of an image, then recompute its checksum and the manifest's."""
    root = Path(ck)
    m = yaml.safe_load((root / "manifest.yaml").read_text())
    entry = max(m["files"], key=lambda f: f["size"])
    img = root / entry["path"]
    data = bytearray(img.read_bytes())
    data[len(data) // 2] ^= 0xFF
    img.unlink()
    img.write_bytes(bytes(data))
    entry["size"], entry["checksum"] = checksum_file(img)
    m.pop("manifest_checksum", None)
    (root / "manifest.yaml").unlink()
    (root / "manifest.yaml").write_text(manifest_text(m))


def test_signed_checkpoint_verifies_with_its_key(signed):
    ck, public, _ = signed
    r = npusnap("verify", ck, "--require-signature", "--trusted-key", public, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "signed by trusted key" in r.stderr


def test_tampered_checkpoint_passes_checksums_but_not_the_signature(signed, tmp_path):
    ck, public, _ = signed
    copy = tmp_path / "ck"
    shutil.copytree(ck, copy)
    mallory = other_user()
    for p in [tmp_path, *tmp_path.parents]:
        if p in (Path("/tmp"), Path("/")):
            break
        os.chmod(p, os.stat(p).st_mode & 0o7777 | 0o111)
    for dirpath, _dirs, filenames in os.walk(copy):
        for n in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            os.chown(n, mallory.uid, mallory.gid)
    as_user(mallory, _tamper, str(copy))
    assert npusnap("verify", copy, timeout=60).returncode == 0  # checksums alone do not catch it
    for argv in (("verify", copy), ("restore", copy, "--detach")):
        r = npusnap(*argv, "--require-signature", "--trusted-key", public, timeout=60)
        assert "does not match the manifest" in assert_failed_cleanly(r, {8})
    # trusted keys configured, no --require-signature: a present signature is still checked
    assert_failed_cleanly(npusnap("verify", copy, "--trusted-key", public, timeout=60), {8})


def test_wrong_key_and_unsigned_are_refused(signed, tmp_path):
    ck, public, other_public = signed
    r = npusnap("verify", ck, "--require-signature", "--trusted-key", other_public, timeout=60)
    assert "not trusted" in assert_failed_cleanly(r, {8})
    unsigned = tmp_path / "unsigned"
    shutil.copytree(ck, unsigned)
    (unsigned / "manifest.sig").unlink()
    assert npusnap("verify", unsigned, timeout=60).returncode == 0
    for argv in (("verify", unsigned), ("restore", unsigned, "--detach")):
        r = npusnap(*argv, "--require-signature", "--trusted-key", public, timeout=60)
        assert "not signed" in assert_failed_cleanly(r, {8})
