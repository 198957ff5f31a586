"""What a capture returns, and the closing steps every capture shares.

A frame captured whole (:mod:`~kiln.capture.frame_capture`) and a frame split at a graph break
(:mod:`~kiln.capture.breaks.split`) end the same way: the graph built so far is closed and
compiled, the new code becomes a function with the original's globals, defaults and closure
(bound again for a method), and the guards, counts and timings are collected. Both call the
functions here, so the two paths cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from kiln.capture import counters
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.bytecode.format import log_code
from kiln.capture.emit import grad_mode_after
from kiln.capture.graph import NumberOutput, OutputGraph
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec
from kiln.capture.values.tensor import TensorValue

__all__ = [
    "CaptureResult",
    "CompileGraph",
    "CompiledGraph",
    "GraphBreak",
    "close_capture",
    "compile_partial",
    "split_method",
]

graph_log = logging.getLogger("kiln.capture.graph")

CompileGraph = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """Where and why a graph was split: the registry kind, its explanation and hint, the user line."""

    kind: str
    explanation: str
    hint: str
    frame: Any


@dataclasses.dataclass
class CaptureResult:
    """What one capture produced; see the package README."""

    code: types.CodeType
    function: Callable[..., Any]
    graphs: list[fx.GraphModule]
    guards: list[GuardSpec]
    graph_breaks: list[GraphBreak] = dataclasses.field(default_factory=list)
    side_effects: list[str] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    passes_through: bool = False
    """The frame runs no graph: it breaks at a call to a callee compiled on its own, which
    reports the break. A recompile of it is not one the user sees (the callee's counts)."""


@dataclasses.dataclass
class CompiledGraph:
    """The frame's graph after :func:`compile_partial`; ``compiled`` is None when it was empty."""

    graphs: list[fx.GraphModule]
    compiled: Callable[..., Any] | None = None
    grad_mode_after: bool | None = None


def split_method(fn: Any, args: tuple[Any, ...]) -> tuple[types.FunctionType, tuple[Any, ...]]:
    """A bound Python method as its function with ``self`` first; plain functions as they are."""
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return fn.__func__, (fn.__self__, *args)
    if isinstance(fn, types.FunctionType):
        return fn, args
    raise unsupported("unsupported_call", f"capturing {type(fn).__name__} objects")


def compile_partial(
    out: OutputGraph,
    outputs: list[TensorValue | NumberOutput],
    func: types.FunctionType,
    compile_graph: CompileGraph,
    what: str = "",
) -> CompiledGraph:
    """Close ``out`` over ``outputs`` and compile it, unless it has neither ops nor outputs."""
    if not (out.has_ops() or outputs):
        return CompiledGraph([])
    gm = out.finish(outputs)
    if graph_log.isEnabledFor(logging.DEBUG):  # the code is written on first use: only then
        graph_log.debug("captured graph of %s%s:\n%s", func.__qualname__, what, gm.code)
    compiled = compile_graph(gm, [i.real for i in out.inputs])  # subclasses: see add_input
    return CompiledGraph([gm], compiled, grad_mode_after(gm))


def close_capture(
    fn: Callable[..., Any],
    func: types.FunctionType,
    code: types.CodeType,
    out: OutputGraph,
    graphs: list[fx.GraphModule],
    breaks: list[GraphBreak],
    timings: dict[str, float],
    *,
    passes_through: bool = False,
) -> CaptureResult:
    """The result of capturing ``fn`` (whose function is ``func``) as the new ``code``."""
    log_code(f"original {func.__qualname__}", func.__code__)
    log_code(f"transformed {func.__qualname__}", code)
    counters.bump("capture", "frames")
    counters.bump("capture", "graphs", len(graphs))
    new_fn = types.FunctionType(
        code, func.__globals__, func.__name__, func.__defaults__, func.__closure__
    )
    new_fn.__kwdefaults__ = func.__kwdefaults__
    new_fn.__qualname__ = func.__qualname__
    function: Callable[..., Any] = new_fn
    if isinstance(fn, types.MethodType):
        function = types.MethodType(new_fn, fn.__self__)
    guards = [*out.guards(), GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())]
    return CaptureResult(
        code=code,
        function=function,
        graphs=graphs,
        guards=guards,
        graph_breaks=breaks,
        side_effects=out.side_effects.describe(),
        timings=timings,
        passes_through=passes_through,
    )
