"""``kiln.stats()``: what Kiln did since the last ``kiln.reset()``, as named counts."""

from __future__ import annotations

import dataclasses

from kiln.capture import counters

__all__ = ["Stats", "stats"]


@dataclasses.dataclass(frozen=True)
class Stats:
    """Counts of compile events; ``kernels`` and ``fallback_ops`` are keyed by backend and op.

    ``cache_hits``/``cache_misses`` count calls that found (or not) a compiled entry in
    memory; ``graph_cache_hits``/``graph_cache_misses`` count graphs loaded from (or not found
    in) the on-disk whole-graph cache. ``ddp_graph_pieces`` counts the pieces the graphs
    compiled under a DDP module's forward were split into at its gradient buckets (one for a
    graph of one bucket; ``ddp_split``). ``compile_seconds`` splits the time spent compiling
    by step (``capture``, ``guards``, ``graph_cache``, ``autograd_aot``, ``loopir.<pass>``,
    ``cpp.build``, ``triton.compile``, ``triton.autotune``), each without the steps inside it.
    """

    frames_captured: int
    graphs_compiled: int
    graph_breaks: int
    recompiles: int
    cache_hits: int
    cache_misses: int
    eager_fallbacks: int
    graph_cache_hits: int
    graph_cache_misses: int
    kernels: dict[str, int]
    fallback_ops: dict[str, int]
    graph_break_kinds: dict[str, int]
    ddp_graph_pieces: int = 0
    compile_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


def stats() -> Stats:
    """A snapshot of Kiln's counters."""
    snap = counters.snapshot()
    s = snap.get("stats", {})
    breaks = snap.get("graph_breaks", {})
    return Stats(
        frames_captured=s.get("frames_captured", 0),
        graphs_compiled=s.get("graphs_compiled", 0),
        graph_breaks=sum(breaks.values()),
        recompiles=snap.get("guards", {}).get("recompiles", 0),
        cache_hits=s.get("cache_hits", 0),
        cache_misses=s.get("cache_misses", 0),
        eager_fallbacks=s.get("eager_fallbacks", 0),
        graph_cache_hits=s.get("graph_cache_hits", 0),
        graph_cache_misses=s.get("graph_cache_misses", 0),
        kernels=dict(snap.get("kernels", {})),
        fallback_ops=dict(snap.get("fallback_ops", {})),
        graph_break_kinds=dict(breaks),
        ddp_graph_pieces=s.get("ddp_graph_pieces", 0),
        compile_seconds=counters.phase_seconds(),
    )
