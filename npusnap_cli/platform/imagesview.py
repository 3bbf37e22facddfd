"""The CRIU images a restore reads, with squatted agent socket names moved aside.

Anyone may bind any abstract Unix socket name, so another user can take
`@npusnap-agent-<pid>` before we restore that pid; CRIU would then fail to
re-bind it (EADDRINUSE). Before CRIU runs we compare the abstract names in the
images (files.img, or sk-unix.img from older CRIU) with the names bound on this
host. A taken agent name is rewritten to a fresh random one in a private
temporary view of the images (an edited copy of that one image, links to the
verified others); the CLI finds the restored agent through the process's own
descriptors, never by name. A taken name of any other socket is one clear error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Optional

from .._protocol import AGENT_SOCKET_PREFIX, AGENT_SOCKET_SUFFIX_HEX
from ..errors import CriuFailed

_AGENT_PREFIX = b"\0" + AGENT_SOCKET_PREFIX.encode()
AGENT_NAME = re.compile(re.escape(_AGENT_PREFIX) + rb"([0-9]+)(-[0-9a-f]{%d})?" % AGENT_SOCKET_SUFFIX_HEX)
SOCKET_IMAGES = ("files.img", "sk-unix.img")


def bound_abstract_names() -> set[bytes]:
    """Every abstract Unix socket name bound in our network namespace (leading NUL included)."""
    names = set()
    try:
        with open("/proc/self/net/unix", encoding="utf-8", errors="surrogateescape") as f:
            next(f, None)
            for line in f:
                parts = line.rstrip("\n").split(None, 7)
                if len(parts) == 8 and parts[7].startswith("@"):
                    names.add(b"\0" + os.fsencode(parts[7][1:]))
    except OSError:
        pass
    return names


def _name(usk: dict[str, Any]) -> bytes:
    import quopri

    raw = usk.get("name", "")
    return quopri.decodestring(raw.encode() if isinstance(raw, str) else raw)


class ImagesView:
    """Context manager: enter(images_dir) gives the directory CRIU should restore from."""

    def __init__(self) -> None:
        self.tmps: list[Path] = []  # one per edited images directory (a set's members each have one)

    def __enter__(self) -> "ImagesView":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.tmps:
            import shutil

            for tmp in self.tmps:
                shutil.rmtree(tmp, ignore_errors=True)

    def enter(self, images_dir: Path, warn: Callable[[str], None]) -> Path:
        taken = bound_abstract_names()
        for image in SOCKET_IMAGES:
            if (images_dir / image).is_file():
                edited = self._rewrite(images_dir / image, taken, warn)
                if edited is not None:
                    return self._view(images_dir, image, edited)
        return images_dir

    def _rewrite(self, path: Path, taken: set[bytes], warn: Callable[[str], None]) -> Optional[Any]:
        if not taken:
            return None
        with open(path, "rb") as f:
            raw = f.read()
        # The image holds each socket's name as raw bytes: none of the taken names in it, nothing
        # to rewrite (the usual case), and pycriu's image definitions (~50 ms to import) stay unloaded.
        if not any(name in raw for name in taken):
            return None
        from pycriu import images

        img = images.loads(raw)
        changed = False
        for entry in img.get("entries", []):
            usk = entry.get("usk", entry) if isinstance(entry, dict) else None
            if not isinstance(usk, dict) or "name" not in usk:
                continue
            name = _name(usk)
            if not name.startswith(b"\0") or name not in taken:
                continue
            shown = name[1:].decode(errors="replace")
            agent_name = AGENT_NAME.fullmatch(name)
            if not agent_name:
                raise CriuFailed(f"the checkpoint's socket @{shown} is bound by another process on this host",
                                 "stop the process that holds that name (see /proc/net/unix), then restore")
            # os.urandom is what secrets.token_hex reads, without hmac's import
            suffix = os.urandom(AGENT_SOCKET_SUFFIX_HEX // 2).hex().encode()
            fresh = _AGENT_PREFIX + agent_name.group(1) + b"-" + suffix
            import quopri

            usk["name"] = quopri.encodestring(fresh).decode()
            changed = True
            warn(f"another process holds the agent's socket name @{shown}; the restored agent "
                 f"listens on @{fresh[1:].decode()} instead")
        return img if changed else None

    def _view(self, images_dir: Path, edited_name: str, img: Any) -> Path:
        import tempfile

        from pycriu import images

        tmp = Path(tempfile.mkdtemp(prefix="npusnap-images-"))
        self.tmps.append(tmp)
        for entry in os.listdir(images_dir):
            if entry != edited_name:
                os.symlink(images_dir / entry, tmp / entry)
        fd = os.open(tmp / edited_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            images.dump(img, f)
        return tmp
