"""Process-wide event counters shared by every Kiln package.

Lower layers count (frames captured, graph breaks, kernels, fallbacks); the
frontend reports them through ``kiln.stats()`` and clears them in
``kiln.reset()``. Living in the lowest layer lets every package count
without importing the frontend.

Categories in use: ``stats`` (frames_captured, graphs_compiled, cache_hits, cache_misses,
eager_fallbacks), ``guards`` (recompiles, misses, limit_eager_runs), ``graph_breaks`` (by break kind), ``kernels`` (by code generator,
e.g. ``cpp``, ``triton``, ``reference``), ``fallback_ops`` (by ATen op name), ``autograd_aot``
(programs: ATen programs compiled, one per grad mode and input aliasing met; aliased_programs).

:func:`phase` times the steps of compiling (capture, guard building, autograd_aot, loopir's
passes, kernel builds, autotuning) as seconds per step name, each step's time without the
steps nested in it, so the steps add up to the time spent compiling and a slow compile says
where its time went (``kiln.stats().compile_seconds``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["counters", "bump", "snapshot", "clear", "phase", "phase_seconds"]

counters: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(
    collections.Counter
)
# ``+=`` on a Counter item is a read and a write: two threads bumping at once would lose one.
_lock = threading.Lock()
_seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
_open = threading.local()  # this thread's open phases: the time of the phases nested in each


def bump(category: str, key: str, n: int = 1) -> None:
    """Add ``n`` to ``counters[category][key]`` (atomically: threads compile and call at once)."""
    with _lock:
        counters[category][key] += n


def snapshot() -> dict[str, dict[str, int]]:
    """A plain-dict copy of every counter, safe to keep across ``clear()``."""
    with _lock:
        return {cat: dict(c) for cat, c in counters.items() if c}


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the time of the block, less that of the phases opened inside it, to ``name``."""
    stack: list[float] | None = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    stack.append(0.0)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        nested = stack.pop()
        if stack:
            stack[-1] += elapsed
        with _lock:
            _seconds[name] += elapsed - nested


def phase_seconds() -> dict[str, float]:
    """The seconds each :func:`phase` took so far, by name."""
    with _lock:
        return dict(_seconds)


def clear() -> None:
    """Forget every count and phase time."""
    with _lock:
        counters.clear()
        _seconds.clear()
