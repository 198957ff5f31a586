"""Safe on-disk caches: private folders, verified entries, atomic writes.

Both code generators keep build products on disk across runs, and the C++ one
loads them into the process with ``dlopen``. So a folder that another user can
write (or owns) is refused, since whoever writes there chooses code this
process runs; a folder that cannot be created or written falls back to a
private one under the system's temporary folder, with one warning either way.

An entry is trusted only when a sidecar written beside it (``<name>.sha256``)
names its exact size and SHA-256. A truncated file mapped into memory faults
with SIGBUS when touched, and an empty or foreign one fails to load every time;
both are caught here by reading the file (never mapping it) and comparing. The
sidecar is written before the entry is renamed into place, so a reader that
sees the entry also sees a sidecar for it (or, when two writers race, for the
other writer's bytes: that reads as a mismatch and costs a rebuild, never a
wrong load).

Writes go to a ``.<name>.<random>.tmp`` sibling and are renamed into place; a
process killed mid-write leaves such a file behind, and :func:`clean_stale`
removes those older than an hour.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
import warnings
from pathlib import Path

__all__ = [
    "CacheDirWarning",
    "atomic_write",
    "clean_stale",
    "private_dir",
    "seal",
    "temporary_sibling",
    "verified",
]

SIDECAR_SUFFIX = ".sha256"
STALE_SECONDS = 3600.0
"""A temporary file this old belongs to a writer that died (builds take seconds)."""

_warned: set[tuple[str, str]] = set()
_cleaned: set[Path] = set()


class CacheDirWarning(RuntimeWarning):
    """A cache folder was unsafe or unusable, and a private one is used instead."""


def _warn_once(path: Path, why: str, replacement: Path) -> None:
    if (str(path), why) in _warned:
        return
    _warned.add((str(path), why))
    warnings.warn(
        f"kiln: not using the cache folder {path} ({why}); using {replacement} instead",
        CacheDirWarning,
        stacklevel=3,
    )


def _unsafe_reason(path: Path) -> str | None:
    """Why an existing ``path`` must not hold code this process loads (None when fine)."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a folder"
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        return f"it is owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users can write it (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _ensure(path: Path) -> str | None:
    """Create ``path`` (mode 0700) if missing; why it cannot be used, or None."""
    try:
        if not path.exists():
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            # mkdir's mode is filtered by the umask; be explicit about the folder we made.
            os.chmod(path, 0o700)
        reason = _unsafe_reason(path)
    except OSError as exc:
        return f"it cannot be created: {exc.strerror or exc}"
    if reason is None and not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return reason


def _fallback_root() -> Path:
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    shared = Path(tempfile.gettempdir()) / f"kiln-cache-{uid}"
    if _ensure(shared) is None:
        return shared
    # Someone else holds that name (or it is unusable): a fresh folder no one else knows.
    return Path(tempfile.mkdtemp(prefix=f"kiln-cache-{uid}-"))


def private_dir(root: Path, *subfolders: str) -> Path:
    """``root/subfolders...`` checked private and writable, else a private fallback.

    Every level from ``root`` down is created with mode 0700 if missing and must
    be a folder of this user that nobody else can write. On the first problem,
    warns once and returns the same subfolders under a private folder in the
    system's temporary folder. The checks are a few ``stat`` calls, repeated on
    every call so that a folder removed meanwhile is made again; stale
    temporaries are removed on the first call per folder.
    """
    result = root.joinpath(*subfolders)
    problem = _first_problem(root, subfolders)
    if problem is not None:
        fallback = _fallback_root()
        result = fallback.joinpath(*subfolders)
        if (fallback_problem := _first_problem(fallback, subfolders)) is not None:
            msg = f"no usable private cache folder ({fallback_problem[0]}: {fallback_problem[1]})"
            raise OSError(msg)
        _warn_once(problem[0], problem[1], result)
    if result not in _cleaned:
        _cleaned.add(result)
        clean_stale(result)
    return result


def _first_problem(root: Path, subfolders: tuple[str, ...]) -> tuple[Path, str] | None:
    """The first level of ``root/subfolders`` that cannot be used, and why."""
    level = root
    for part in ("", *subfolders):
        level = level / part if part else level
        if (reason := _ensure(level)) is not None:
            return level, reason
    return None


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


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def seal(staged: Path, final: Path) -> None:
    """Move the finished file ``staged`` to ``final`` with a sidecar that vouches for it."""
    size, sha = _digest(staged)
    atomic_write(_sidecar(final), json.dumps({"size": size, "sha256": sha}))
    os.replace(staged, final)


def verified(path: Path) -> bool:
    """Whether ``path`` exists and matches the size and hash its sidecar records."""
    try:
        record = json.loads(_sidecar(path).read_text())
        if path.stat().st_size != record["size"]:
            return False
        return _digest(path) == (record["size"], record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def clean_stale(folder: Path, max_age: float = STALE_SECONDS) -> list[Path]:
    """Remove ``*.tmp`` files in ``folder`` older than ``max_age`` seconds; the removed."""
    removed: list[Path] = []
    now = time.time()
    try:
        candidates = list(folder.glob("*.tmp"))
    except OSError:
        return removed
    for path in candidates:
        try:
            if now - path.lstat().st_mtime > max_age:
                path.unlink()
                removed.append(path)
        except OSError:
            continue  # another process removed or renamed it first
    return removed
