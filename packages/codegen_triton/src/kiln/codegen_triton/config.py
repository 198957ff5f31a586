"""Options of the Triton backend, read from the environment once and settable in code.

``KILN_MAX_AUTOTUNE=1`` widens the autotuning candidate sets and enables the
matmul templates; ``KILN_TRITON_CACHE`` moves the on-disk cache (default ``triton`` under
the root of Kiln's caches, ``KILN_CACHE_DIR``, else ``~/.cache/kiln``);
``KILN_TRITON_PARALLEL_COMPILE=0`` compiles kernels in the calling process.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from kiln.loopir import disk_cache

__all__ = ["TritonOptions", "options"]


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value not in ("0", "", "false", "False")


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


@dataclasses.dataclass
class TritonOptions:
    """What the backend reads when it generates, tunes and launches kernels."""

    max_autotune: bool = dataclasses.field(
        default_factory=lambda: _flag("KILN_MAX_AUTOTUNE", False)
    )
    persistent_reduction_limit: int = 8192
    """Reductions up to this many elements per row fit one block (no r-loop)."""
    cache_dir: Path = dataclasses.field(
        default_factory=lambda: Path(
            os.environ.get("KILN_TRITON_CACHE") or disk_cache.cache_root() / "triton"
        )
    )
    parallel_compile: bool = dataclasses.field(
        default_factory=lambda: _flag("KILN_TRITON_PARALLEL_COMPILE", True)
    )
    compile_workers: int = dataclasses.field(default_factory=lambda: min(8, _usable_cpus()))


options = TritonOptions()
"""The process-wide options (tests replace fields and restore them)."""
