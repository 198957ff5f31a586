"""Process-wide event counters shared by every Kiln package.

Lower layers count (frames captured, graph breaks, kernels, fallbacks); the
frontend reports them through ``kiln.stats()`` and clears them in
``kiln.reset()``. Living in the lowest layer lets every package count
without importing the frontend.

Categories in use: ``stats`` (frames_captured, graphs_compiled, cache_hits, cache_misses,
eager_fallbacks), ``guards`` (recompiles, misses, limit_eager_runs), ``graph_breaks`` (by break kind), ``kernels`` (by code generator,
e.g. ``cpp``, ``triton``, ``reference``), ``fallback_ops`` (by ATen op name), ``autograd_aot``
(programs: ATen programs compiled, one per grad mode and input aliasing met; aliased_programs).
"""

from __future__ import annotations

import collections
import threading

__all__ = ["counters", "bump", "snapshot", "clear"]

counters: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(
    collections.Counter
)
# ``+=`` on a Counter item is a read and a write: two threads bumping at once would lose one.
_lock = threading.Lock()


def bump(category: str, key: str, n: int = 1) -> None:
    """Add ``n`` to ``counters[category][key]`` (atomically: threads compile and call at once)."""
    with _lock:
        counters[category][key] += n


def snapshot() -> dict[str, dict[str, int]]:
    """A plain-dict copy of every counter, safe to keep across ``clear()``."""
    with _lock:
        return {cat: dict(c) for cat, c in counters.items() if c}


def clear() -> None:
    """Forget every count."""
    with _lock:
        counters.clear()
