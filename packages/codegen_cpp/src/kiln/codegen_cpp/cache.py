"""The on-disk cache of built shared libraries.

Entries are keyed by a hash of everything that decides the binary: the source,
the compiler flags, the compiler's version, the bundled headers and Kiln's
version. The folder is private to the user (mode 0700) because a library placed
there gets loaded into the process. Every write goes to a temporary name in the
same folder and is renamed into place, so a concurrent process or a crash never
leaves a half-written entry under a real key.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["atomic_write", "cache_dir", "cache_key", "temporary_sibling"]

_ENV = "KILN_CACHE_DIR"


def cache_dir() -> Path:
    """The folder for C++ builds, created with mode 0700 if missing.

    ``KILN_CACHE_DIR`` overrides the default ``$XDG_CACHE_HOME/kiln``
    (``~/.cache/kiln`` without it); builds go into its ``cpp`` subfolder.
    """
    override = os.environ.get(_ENV)
    if override:
        root = Path(override)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "kiln"
    folder = root / "cpp"
    _make_private_dir(root)
    _make_private_dir(folder)
    return folder


def _make_private_dir(path: Path) -> None:
    if path.is_dir():
        return
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir's mode is filtered by the umask; be explicit about the folder we made.
    os.chmod(path, 0o700)


def cache_key(parts: Iterable[str | bytes]) -> str:
    """A hex digest over ``parts``, each length-prefixed so boundaries count."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:40]


def temporary_sibling(path: Path) -> Path:
    """A fresh, unused name next to ``path`` for writing before a rename."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so readers see either nothing or all of it."""
    tmp = temporary_sibling(path)
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
