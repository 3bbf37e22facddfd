"""Optional Ed25519 signatures on checkpoints: checksums catch corruption, a signature
catches tampering (anyone who can write a directory can recompute its checksums).

DIR/manifest.sig is one line, `ed25519 <public key, hex> <signature, hex>`, the signature
over the exact bytes of manifest.yaml. That file lists every image's checksum and ends
with a checksum of itself, so the signature covers every file. Keys are PEM files
(PKCS#8 private, SubjectPublicKeyInfo public), as `openssl genpkey -algorithm ed25519` writes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import ConfigProblem, ImageInvalid
from .format import MANIFEST, SIGNATURE

ALGORITHM = "ed25519"


def _read_private(keyfile: Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(keyfile).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigProblem(f"cannot load the signing key {keyfile}: {e}",
                            "give an unencrypted Ed25519 private key in PEM (openssl genpkey -algorithm ed25519)",
                            ) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigProblem(f"the signing key {keyfile} is not an Ed25519 key", "use an Ed25519 key")
    return key


def _raw_public(key: Any) -> bytes:
    """A public key's raw bytes (of a private key: its public half's)."""
    from cryptography.hazmat.primitives import serialization

    if hasattr(key, "public_key"):
        key = key.public_key()
    return bytes(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def trusted_keys(files: Sequence[Path]) -> dict[bytes, Any]:
    """The trusted public keys (raw bytes -> key), from PEM files (a private key file works too)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    keys: dict[bytes, Any] = {}
    for f in files:
        try:
            data = Path(f).read_bytes()
            try:
                key: Any = serialization.load_pem_public_key(data)
            except ValueError:
                key = serialization.load_pem_private_key(data, password=None)
        except (OSError, ValueError, TypeError) as e:
            raise ConfigProblem(f"cannot load the trusted key {f}: {e}", "give an Ed25519 public key in PEM") from e
        if isinstance(key, Ed25519PrivateKey):
            key = key.public_key()
        if not isinstance(key, Ed25519PublicKey):
            raise ConfigProblem(f"the trusted key {f} is not an Ed25519 key", "use an Ed25519 key")
        keys[_raw_public(key)] = key
    return keys


def generate_keypair(private: Path, public: Path) -> str:
    """A new Ed25519 pair as PEM files, created with O_EXCL (private 0600); returns the public key, hex."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..errors import StorageProblem

    key = Ed25519PrivateKey.generate()
    blobs = ((private, 0o600, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption())),
             (public, 0o644, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo)))
    for path, mode, data in blobs:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except OSError as e:
            raise StorageProblem(f"cannot create {path}: {e.strerror}", "choose a path that does not exist yet") from e
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return _raw_public(key).hex()


class Signer:
    """Loaded before a checkpoint starts (a bad key fails first), used once it is committed."""

    def __init__(self, keyfile: Path) -> None:
        self.key = _read_private(keyfile)

    def sign(self, root: Path) -> None:
        body = _read_nofollow(root / MANIFEST)
        line = f"{ALGORITHM} {_raw_public(self.key).hex()} {self.key.sign(body).hex()}\n"
        tmp = root / f".{SIGNATURE}.{os.urandom(8).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, root / SIGNATURE)


def check(root: Path, trusted: Sequence[Path] = (), require: bool = False) -> Optional[str]:
    """Refuse (ImageInvalid) a checkpoint not signed by a trusted key when `require`, or whose
    present signature fails against the configured trusted keys. Returns the signer's key
    (hex) when a signature was checked, else None."""
    path = root / SIGNATURE
    present = os.path.lexists(path)
    if require and not trusted:
        raise ConfigProblem("--require-signature needs at least one --trusted-key",
                            "pass --trusted-key FILE, or set verify/restore trusted_key in the config")
    if not present:
        if require:
            raise ImageInvalid(f"{root} is not signed ({SIGNATURE} is missing) and a signature is required",
                               "sign checkpoints with `npusnap checkpoint --sign-key KEY`")
        return None
    if not trusted:
        return None  # nothing to check it against
    try:
        algorithm, public_hex, sig_hex = _read_nofollow(path).decode().split()
        public, signature = bytes.fromhex(public_hex), bytes.fromhex(sig_hex)
    except (ValueError, UnicodeDecodeError):
        raise ImageInvalid(f"{root / SIGNATURE} is malformed") from None
    keys = trusted_keys(trusted)
    if algorithm != ALGORITHM or public not in keys:
        raise ImageInvalid(f"{root} is signed by a key that is not trusted ({public_hex[:16]}...)",
                           "add the signer's public key with --trusted-key, or do not trust this checkpoint")
    from cryptography.exceptions import InvalidSignature

    try:
        keys[public].verify(signature, _read_nofollow(root / MANIFEST))
    except InvalidSignature:
        raise ImageInvalid(f"{root}: the signature does not match the manifest (tampered with)",
                           "restore from a trusted copy") from None
    return public_hex


def _read_nofollow(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ImageInvalid(f"cannot read {path}: {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ImageInvalid(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(16 << 20)
    finally:
        os.close(fd)
