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

:func:`memoized` keeps a slow probe's answer (what a compiler reports about itself) as such an
entry, stamped by what would change the answer (the compiler's path, size and modification
time): a later process reads one small file instead of running the probe again.

Each folder is bounded (``KILN_CACHE_SIZE_MB``, default 1024): an entry is the
files sharing a name up to the first dot (``<key>.so``, its sidecar, its
source), its last use is its newest modification time (a hit calls
:func:`touch`), and :func:`evict` removes the least recently used entries until
the folder fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

__all__ = [
    "CacheDirWarning",
    "Entry",
    "atomic_write",
    "cache_root",
    "clean_stale",
    "clear",
    "entries",
    "evict",
    "memoized",
    "private_dir",
    "read_verified",
    "seal",
    "size_limit",
    "temporary_sibling",
    "touch",
    "verified",
]

SIDECAR_SUFFIX = ".sha256"
STALE_SECONDS = 3600.0
"""A temporary file this old belongs to a writer that died (builds take seconds)."""

SIZE_ENV = "KILN_CACHE_SIZE_MB"
DEFAULT_SIZE_MB = 1024.0

_warned: set[tuple[str, str]] = set()
_cleaned: set[Path] = set()


class CacheDirWarning(RuntimeWarning):
    """A cache folder was unsafe or unusable, and a private one is used instead."""


def cache_root() -> Path:
    """The root of Kiln's on-disk caches, each code generator's in its own folder below:
    ``KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln`` (``~/.cache/kiln`` without it)."""
    override = os.environ.get("KILN_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kiln"


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


def read_verified(path: Path) -> bytes | None:
    """``path``'s bytes if they match the size and hash its sidecar records, else None (read
    once, so a file replaced between the check and the read cannot slip through)."""
    try:
        record = json.loads(_sidecar(path).read_text())
        data = path.read_bytes()
        if (len(data), hashlib.sha256(data).hexdigest()) != (record["size"], record["sha256"]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


def memoized(
    folder: Path,
    name: str,
    stamp: str,
    compute: Callable[[], Any],
    valid: Callable[[Any], bool] = lambda _: True,
) -> Any:
    """``compute()``'s answer (JSON data), kept in ``folder`` for later processes as long as
    ``stamp`` (whatever would change the answer, as text) stays the same.

    The entry is ``<name>-<digest of stamp>.json``, sealed like any entry and holding the
    stamp itself; one that is missing, fails verification, holds another stamp or an answer
    ``valid`` refuses is computed again and replaced, and the folder trimmed to its bound. A
    folder that cannot be written costs only the saving: the answer is still returned."""
    path = folder / f"{name}-{hashlib.sha256(stamp.encode()).hexdigest()[:32]}.json"
    data = read_verified(path)
    if data is not None:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            record = json.loads(data)
            if record["stamp"] == stamp and valid(record["answer"]):
                touch(path)
                return record["answer"]
    answer = compute()
    with contextlib.suppress(OSError):
        staged = temporary_sibling(path)
        try:
            staged.write_text(json.dumps({"stamp": stamp, "answer": answer}))
            seal(staged, path)
        finally:
            staged.unlink(missing_ok=True)  # gone after the rename; left by a failed write
        evict(folder, keep={path.name.split(".", 1)[0]})
    return answer


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


@dataclasses.dataclass(frozen=True)
class Entry:
    """The files of one cache entry, their total size and when it was last used."""

    stem: str
    files: tuple[Path, ...]
    size: int
    last_used: float


def entries(folder: Path) -> list[Entry]:
    """The entries of ``folder`` (its plain files, temporaries excepted), least recent first."""
    groups: dict[str, list[tuple[Path, os.stat_result]]] = {}
    try:
        children = list(folder.iterdir())
    except OSError:
        return []
    for path in children:
        if path.name.startswith(".") or path.name.endswith(".tmp"):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue  # removed meanwhile
        if stat.S_ISREG(info.st_mode):
            groups.setdefault(path.name.split(".", 1)[0], []).append((path, info))
    found = [
        Entry(
            stem,
            tuple(sorted(path for path, _ in files)),
            sum(info.st_size for _, info in files),
            max(info.st_mtime for _, info in files),
        )
        for stem, files in groups.items()
    ]
    return sorted(found, key=lambda e: (e.last_used, e.stem))


def touch(path: Path) -> None:
    """Mark ``path``'s entry used now (the eviction order reads modification times)."""
    with contextlib.suppress(OSError):  # evicted or unwritable: only the order suffers
        os.utime(path)


def size_limit() -> int:
    """The bound on each cache folder in bytes, from ``KILN_CACHE_SIZE_MB``."""
    try:
        megabytes = float(os.environ.get(SIZE_ENV, DEFAULT_SIZE_MB))
    except ValueError:
        megabytes = DEFAULT_SIZE_MB
    return max(0, int(megabytes * 1024 * 1024))


def evict(folder: Path, limit: int | None = None, keep: Collection[str] = ()) -> list[Entry]:
    """Remove least recently used entries until ``folder`` holds at most ``limit`` bytes.

    ``limit`` defaults to :func:`size_limit`. Entries whose stem is in ``keep``
    (what the caller is about to load) stay even past the bound. A removed library that a process
    has loaded stays mapped there; a later lookup misses and rebuilds it.
    """
    bound = size_limit() if limit is None else limit
    found = entries(folder)
    total = sum(entry.size for entry in found)
    removed: list[Entry] = []
    for entry in found:
        if total <= bound:
            break
        if entry.stem in keep:
            continue
        for path in entry.files:
            with contextlib.suppress(OSError):
                path.unlink()
        total -= entry.size
        removed.append(entry)
    return removed


def clear(folder: Path) -> int:
    """Remove everything inside ``folder`` (kept itself); the number of entries removed."""
    count = len(entries(folder))
    try:
        children = list(folder.iterdir())
    except OSError:
        return 0
    for path in children:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return count
