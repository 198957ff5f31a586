"""``explain(fn)(*args)``: run ``fn`` once under capture and report its graphs and breaks.

Every frame reached (``fn`` itself, the continuations its graph breaks
create, callees that could not be inlined) is captured with a backend that
runs the graph as is, so the run's result is the eager one. The report lists
the graphs with their ops and guards, and each break with its reason, the
user's ``file:line`` and source text, and the registry's hint. Frames that
could not be captured at all run eagerly: they are reported as breaks too, and
listed in ``gave_up`` with the frame's name and why capture gave up on it (a
break before any graph could be made, or a failure inside capture itself), so
that a frame compiling nothing is never silent.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from kiln.capture.errors import Unsupported
from kiln.capture.frame_capture import GraphBreak, capture
from kiln.capture.guard_data import GuardSpec
from kiln.capture.user_words import user_expr

__all__ = ["EagerFrame", "ExplainOutput", "explain", "op_names"]

breaks_log = logging.getLogger("kiln.capture.graph_breaks")


def op_names(gm: fx.GraphModule) -> list[str]:
    """The ops of ``gm`` in order: a function's ``__name__`` or a method's name."""
    names = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            names.append(getattr(n.target, "__name__", str(n.target)))
        elif n.op in ("call_method", "call_module"):
            names.append(str(n.target))
    return names


@dataclasses.dataclass(frozen=True)
class EagerFrame:
    """A frame capture gave up on whole (it ran eagerly): its qualified name and the reason."""

    name: str
    reason: GraphBreak


@dataclasses.dataclass
class ExplainOutput:
    """What one run produced: graphs, their ops and guards, and the graph breaks."""

    graphs: list[fx.GraphModule] = dataclasses.field(default_factory=list)
    guards: list[list[GuardSpec]] = dataclasses.field(default_factory=list)
    breaks: list[GraphBreak] = dataclasses.field(default_factory=list)
    gave_up: list[EagerFrame] = dataclasses.field(default_factory=list)
    result: Any = None
    codes: list[types.CodeType | None] = dataclasses.field(default_factory=list, repr=False)
    """The code each graph was captured from: its guards print in the user's words."""

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.breaks)

    @property
    def ops_per_graph(self) -> list[list[str]]:
        return [op_names(g) for g in self.graphs]

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}", f"Graph break count: {self.graph_break_count}"]
        if self.breaks:
            lines.append("Break reasons:")
        for i, b in enumerate(self.breaks, 1):
            lines.append(f"  {i}. {b.kind}: {b.explanation}")
            if b.frame is not None:
                lines.append(f"     at {b.frame.filename}:{b.frame.lineno} in {b.frame.name}")
                if b.frame.source:
                    lines.append(f"       {b.frame.source.strip()}")
            if b.hint:
                lines.append(f"     hint: {b.hint}")
        if self.gave_up:
            lines.append("Frames run eagerly (capture gave up on them whole):")
        for f in self.gave_up:
            at = f.reason.frame
            where = f" at {at.filename}:{at.lineno}" if at is not None else ""
            lines.append(f"  {f.name}: {f.reason.kind}: {f.reason.explanation}{where}")
        codes = self.codes if len(self.codes) == len(self.guards) else [None] * len(self.guards)
        for i, (ops, guards, code) in enumerate(
            zip(self.ops_per_graph, self.guards, codes, strict=True), 1
        ):
            lines.append(f"Graph {i}: {len(ops)} ops, {len(guards)} guards")
            lines.append(f"  ops: {', '.join(ops) or '-'}")
            for g in guards:
                where = f"{user_expr(g.source, code)} " if g.source is not None else ""
                lines.append(f"  guard: {where}{g.kind.name}")
        return "\n".join(lines)


class _Run:
    """Captures each frame reached during one call and records what the first capture made."""

    def __init__(self) -> None:
        self.report = ExplainOutput()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        recorded = False

        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal recorded
            graphs: list[fx.GraphModule] = []

            def compile_graph(gm: fx.GraphModule, example: list[torch.Tensor]) -> Any:
                graphs.append(gm)
                return gm.forward

            try:
                result = capture(
                    fn, args, kwargs, compile_graph=compile_graph, wrap_callable=self.wrap
                )
            except Unsupported as e:
                self._give_up(fn, GraphBreak(e.kind, e.explanation, e.hint, e.frame), recorded)
                recorded = True
                return fn(*args, **kwargs)
            except Exception as e:  # capture itself failed: the frame runs eagerly, as compile's
                why = GraphBreak("capture_failed", f"{type(e).__name__}: {e}", "", None)
                self._give_up(fn, why, recorded)
                recorded = True
                return fn(*args, **kwargs)
            if not recorded:
                recorded = True
                self.report.graphs.extend(graphs)
                self.report.guards.extend(list(result.guards) for _ in graphs)
                self.report.codes.extend(getattr(fn, "__code__", None) for _ in graphs)
                self.report.breaks.extend(result.graph_breaks)
            return result.function(*args, **kwargs)

        return call

    def _give_up(self, fn: Callable[..., Any], why: GraphBreak, recorded: bool) -> None:
        name = getattr(fn, "__qualname__", repr(fn))
        breaks_log.info(
            "capture gave up on %s, which runs eagerly: %s: %s", name, why.kind, why.explanation
        )
        if not recorded:
            self.report.breaks.append(why)
            self.report.gave_up.append(EagerFrame(name, why))


def explain(fn: Callable[..., Any]) -> Callable[..., ExplainOutput]:
    """``explain(fn)(*args, **kwargs)`` runs ``fn`` once and returns an :class:`ExplainOutput`.

    ``fn`` is a function, a bound method or an ``nn.Module`` (called with its hooks).
    """

    target = fn
    if isinstance(fn, torch.nn.Module):

        def target(*args: Any, **kwargs: Any) -> Any:  # a frame that calls the module
            return fn(*args, **kwargs)

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        r = _Run()
        r.report.result = r.wrap(target)(*args, **kwargs)
        breaks_log.info("explain %s:\n%s", getattr(fn, "__qualname__", fn), r.report)
        return r.report

    return run
