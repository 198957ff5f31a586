"""The on-disk cache of built shared libraries.

Entries are keyed by a hash of everything that decides the binary: the source,
the compiler flags, the compiler's version, the bundled headers and Kiln's
version. The folder must be private to the user because a library placed there
gets loaded into the process; :mod:`kiln.loopir.disk_cache` checks that (falling
back to a private folder), writes atomically, and vouches for every library with
a size-and-hash sidecar that is checked before the library is loaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from kiln.loopir.disk_cache import (
    atomic_write,
    cache_root,
    evict,
    private_dir,
    seal,
    temporary_sibling,
    touch,
    verified,
)

__all__ = [
    "atomic_write",
    "cache_dir",
    "cache_key",
    "probe_dir",
    "cache_root",
    "evict",
    "seal",
    "temporary_sibling",
    "touch",
    "verified",
]


def cache_dir() -> Path:
    """The folder for C++ builds: ``cache_root()/cpp``, private (0700), created if missing.

    A root or folder that another user owns or can write, or that cannot be
    created or written, is replaced (with one warning) by a private folder under
    the system's temporary folder.
    """
    return private_dir(cache_root(), "cpp")


def probe_dir() -> Path:
    """The folder for what the compiler says of itself (:func:`~kiln.codegen_cpp.build.toolchain`'s
    probes): ``cache_root()/probes``, kept apart from the libraries, with the same checks."""
    return private_dir(cache_root(), "probes")


def cache_key(parts: Iterable[str | bytes]) -> str:
    """A hex digest over ``parts``, each length-prefixed so boundaries count."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:40]
