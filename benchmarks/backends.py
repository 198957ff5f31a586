"""The columns of a benchmark run: plain eager, Kiln's backends, and torch.compile's.

Names: ``eager`` (PyTorch eager, the baseline), ``kiln`` (Kiln's default backend), any other
name Kiln registers (``aot_eager``, ``loopir_reference``, ...) or ``kiln:<name>`` for Kiln's
backend ``<name>`` (``kiln:eager``), and ``torch_compile`` (torch.compile with Inductor) or
``torch_compile:<backend>``. torch.compile is only ever used here, as the reference Kiln is
measured against. Each compiled column wraps its backend to count graphs and their operators.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

__all__ = ["Column", "CaptureLog", "make_column"]

GraphBackend = Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]]
_OP_KINDS = ("call_function", "call_method", "call_module")


@dataclasses.dataclass
class CaptureLog:
    """Operators per graph handed to a backend, as the compiler captured them."""

    ops_per_graph: list[int] = dataclasses.field(default_factory=list)

    def wrap(self, inner: GraphBackend) -> GraphBackend:
        def counting(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
            self.ops_per_graph.append(sum(n.op in _OP_KINDS for n in gm.graph.nodes))
            return inner(gm, example_inputs)

        counting.__name__ = getattr(inner, "__name__", "counting")
        return counting


@dataclasses.dataclass
class Column:
    """One backend: how to compile a model, reset between models, and what it reports.

    ``reset`` drops everything its compiler compiled, including other columns' work (Kiln's
    backends share one cache, as torch.compile's do), so it runs once per model before any
    column compiles; ``clear_stats`` zeroes only the counters ``stats`` reads.
    """

    name: str
    compile: Callable[[torch.nn.Module], Callable[..., Any]]
    reset: Callable[[], None]
    clear_stats: Callable[[], None]
    stats: Callable[[], dict[str, Any]]
    log: CaptureLog


def _eager(name: str) -> Column:
    return Column(name, lambda m: m, lambda: None, lambda: None, dict, CaptureLog())


def _loopir_kernels(kiln: Any) -> int:
    """Kernels loopir counted, for Kiln versions whose ``stats().kernels`` misses them."""
    snapshot: dict[str, Any] = getattr(getattr(kiln, "counters", None), "snapshot", dict)()
    return int(snapshot.get("loopir", {}).get("kernels", 0))


def _kiln(name: str, backend: str, count_ops: bool) -> Column:
    import kiln

    log = CaptureLog()
    lookup = getattr(getattr(kiln, "backends", None), "lookup_backend", None)
    # Kiln treats its own backend apart (its whole-graph cache among others) only when
    # handed that very function: a counting wrapper is a user backend to it
    chosen: Any = log.wrap(lookup(backend)) if lookup and count_ops else backend

    def stats() -> dict[str, Any]:
        s = kiln.stats()

        def get(field: str, default: Any = None) -> Any:
            return getattr(s, field, default)

        return {
            "graphs": get("graphs_compiled"),
            "graph_breaks": get("graph_breaks"),
            "recompiles": get("recompiles"),
            "eager_fallbacks": get("eager_fallbacks"),
            "kernels": sum((get("kernels") or {}).values()) or _loopir_kernels(kiln),
            "fallback_ops": dict(get("fallback_ops") or {}),
            "break_kinds": dict(get("graph_break_kinds") or {}),
            "graph_cache_hits": get("graph_cache_hits"),
            "graph_cache_misses": get("graph_cache_misses"),
            "compile_seconds": {k: round(v, 3) for k, v in (get("compile_seconds") or {}).items()},
        }

    return Column(
        name, lambda m: kiln.compile(m, backend=chosen), kiln.reset, kiln.counters.clear, stats, log
    )


def _torch_compile(name: str, backend: str) -> Column:
    import torch._dynamo
    from torch._dynamo.utils import counters

    log = CaptureLog()
    inner: Any = torch._dynamo.lookup_backend(backend)
    chosen = log.wrap(inner)

    def kernels() -> int | None:
        try:
            from torch._inductor import metrics
        except ImportError:
            return None
        return int(metrics.generated_kernel_count)

    def stats() -> dict[str, Any]:
        breaks = {str(k): int(v) for k, v in counters["graph_break"].items()}
        return {
            "graphs": len(log.ops_per_graph),
            "graph_breaks": sum(breaks.values()),
            "recompiles": None,
            "eager_fallbacks": None,
            "kernels": kernels() if backend == "inductor" else 0,
            "fallback_ops": {},
            "break_kinds": breaks,
        }

    def clear_stats() -> None:
        counters.clear()
        try:
            from torch._inductor import metrics

            metrics.reset()
        except ImportError:
            pass

    def reset() -> None:
        torch._dynamo.reset()
        clear_stats()

    return Column(name, lambda m: torch.compile(m, backend=chosen), reset, clear_stats, stats, log)


def make_column(name: str, count_ops: bool = True) -> Column:
    """The column for a backend name (see the module docstring); ValueError if unknown.
    ``count_ops=False`` leaves Kiln's backends unwrapped (no operator counts), as a user's
    ``kiln.compile`` gets them: what first-call times with warm caches need."""
    if name == "eager":
        return _eager(name)
    if name == "torch_compile" or name.startswith("torch_compile:"):
        return _torch_compile(name, name.partition(":")[2] or "inductor")
    backend = name.removeprefix("kiln:") if name.startswith("kiln:") else name
    import kiln

    if backend not in kiln.list_backends():
        valid = ", ".join(["eager", "torch_compile", *kiln.list_backends()])
        msg = f"unknown backend {name!r}; valid: {valid} (or kiln:<name>, torch_compile:<name>)"
        raise ValueError(msg)
    return _kiln(name, backend, count_ops)
