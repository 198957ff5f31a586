"""Kiln's on-disk caches: where they are, how big, and emptying them.

Folders persist across runs: built C++ libraries (``KILN_CACHE_DIR``,
default ``~/.cache/kiln``, subfolder ``cpp``), what the C++ compiler says of itself
(``probes``), compiled graphs (subfolder ``graphs``,
:mod:`kiln.graph_cache`), compiled guard checks (``guards``) and generated Triton kernels
(``KILN_TRITON_CACHE``, default ``~/.cache/kiln/triton``; listed only where
``kiln.codegen_triton`` and Triton can be imported). Each is bounded by
``KILN_CACHE_SIZE_MB`` with least-recently-used eviction. ``python -m kiln cache
info`` and ``python -m kiln cache clear`` do the same from a shell.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kiln import graph_cache
from kiln.codegen_cpp.cache import cache_dir as cpp_cache_dir
from kiln.codegen_cpp.cache import probe_dir
from kiln.loopir import disk_cache

try:  # Triton is optional: without it there are no Triton kernels to cache
    from kiln.codegen_triton.config import TritonOptions
    from kiln.codegen_triton.config import options as _options

    triton_options: TritonOptions | None = _options
except ImportError:
    triton_options = None

__all__ = ["CacheInfo", "clear", "folders", "info"]


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    """One cache folder: its path, how many entries it holds and their total bytes."""

    name: str
    path: Path
    entries: int
    size: int


def folders() -> dict[str, Path]:
    """Each cache's folder, after the same privacy checks (and fallback) a build makes."""
    found = {
        "cpp": cpp_cache_dir(),
        "probes": probe_dir(),
        "graphs": graph_cache.folder(),
        "guards": graph_cache.checks_folder(),
    }
    if triton_options is not None:
        triton_root = triton_options.cache_dir
        found["triton kernels"] = disk_cache.private_dir(triton_root, "kernels")
        found["triton autotune"] = disk_cache.private_dir(triton_root, "autotune")
    return found


def info() -> list[CacheInfo]:
    """The entries and bytes of every cache folder."""
    found = []
    for name, path in folders().items():
        entries = disk_cache.entries(path)
        found.append(CacheInfo(name, path, len(entries), sum(e.size for e in entries)))
    return found


def clear() -> int:
    """Empty every cache folder; the number of entries removed.

    Libraries and modules this process already loaded keep working; the next
    compile of their graphs builds them again.
    """
    return sum(disk_cache.clear(path) for path in folders().values())
