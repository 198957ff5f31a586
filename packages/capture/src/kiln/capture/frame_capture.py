"""``capture()``: one call of a Python function to a graph, guards and new code.

This is the entry the frontend calls on a cache miss. It binds the real
arguments, traces the function symbolically (inlining what it calls),
closes the graph, hands it to ``compile_graph`` with the real tensors as
example inputs, and emits a code object that calls the compiled graph.
Where it meets something it cannot model, :mod:`kiln.capture.breaks` splits
the frame (a graph break); what cannot be split soundly, or anything with
``fullgraph=True``, raises :class:`~kiln.capture.errors.Unsupported` and the
caller runs the frame eagerly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from kiln.capture import counters
from kiln.capture.binding import code_signature
from kiln.capture.break_reasons import unsupported
from kiln.capture.break_tracer import BreakTracer
from kiln.capture.bytecode.format import log_code
from kiln.capture.emit import emit_code, grad_mode_after, graph_outputs
from kiln.capture.errors import Unsupported
from kiln.capture.graph import EAGER_RANDOM, OutputGraph
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec
from kiln.capture.isolation import no_user_hooks
from kiln.capture.source import ClosureSource, LocalSource
from kiln.capture.tracer import CO_GENERATOR_LIKE
from kiln.capture.values.base import Value
from kiln.capture.values.containers import CellValue
from kiln.capture.wrap import wrap

__all__ = ["CaptureResult", "GraphBreak", "capture", "trace_frame"]

log = logging.getLogger(__name__)
graph_log = logging.getLogger("kiln.capture.graph")


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


@dataclasses.dataclass
class TracedFrame:
    """A finished trace: the graph under construction, its inputs and the returned value."""

    out: OutputGraph
    result: Value
    func: types.FunctionType


def _split_method(fn: Any, args: tuple[Any, ...]) -> tuple[types.FunctionType, tuple[Any, ...]]:
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return fn.__func__, (fn.__self__, *args)
    if isinstance(fn, types.FunctionType):
        return fn, args
    raise unsupported("unsupported_call", f"capturing {type(fn).__name__} objects")


def _fresh_containers(code: types.CodeType) -> list[str]:
    rest = code.co_argcount + code.co_kwonlyargcount
    names = []
    if code.co_flags & 0x04:
        names.append(code.co_varnames[rest])
        rest += 1
    if code.co_flags & 0x08:
        names.append(code.co_varnames[rest])
    return names


def trace_frame(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TracedFrame:
    """Trace one call of ``fn`` symbolically; raise :class:`Unsupported` if it cannot."""
    func, args = _split_method(fn, args)
    code = func.__code__
    if code.co_flags & CO_GENERATOR_LIKE:
        raise unsupported("unsupported_call", f"generator or coroutine {code.co_qualname}")
    grad_mode = torch.is_grad_enabled()
    out = OutputGraph()
    out.eager_random = bool(getattr(func, EAGER_RANDOM, False))
    try:
        try:
            bound = code_signature(func).bind(*args, **kwargs)
        except TypeError as e:
            raise unsupported("user_exception", f"TypeError: {e}") from e
        bound.apply_defaults()
        f_locals = {
            name: wrap(out, value, LocalSource(name)) for name, value in bound.arguments.items()
        }
        for name in _fresh_containers(code):
            # *args and **kwargs are new objects each call: the trace may mutate them
            if name in f_locals:
                f_locals[name].source = None
        cells = {
            name: CellValue(real=cell, source=ClosureSource(name))
            for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False)
        }
        tracer = BreakTracer(code, func.__globals__, out, f_locals=f_locals, cells=cells)
        result = tracer.run()
    except Unsupported:
        raise
    except RecursionError as e:
        raise unsupported("inline_limit", "Python recursion limit") from e
    except Exception as e:  # an internal error must not break the user's program
        log.exception("internal error while capturing %s", code.co_qualname)
        counters.bump("capture", "internal_error")
        raise unsupported("internal_error", f"{type(e).__name__}: {e}") from e
    finally:
        for ctx in reversed(out.entered):
            ctx.__exit__(None, None, None)
        torch._C._set_grad_enabled(grad_mode)
    return TracedFrame(out, result, func)


def capture(
    fn: Callable[..., Any],
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None,
    *,
    compile_graph: Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]],
    wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    fullgraph: bool = False,
) -> CaptureResult:
    """Capture one call of ``fn`` (a function or bound method); see the package README."""
    with no_user_hooks():
        return _capture(fn, args, kwargs, compile_graph, wrap_callable, fullgraph)


def _capture(
    fn: Callable[..., Any],
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None,
    compile_graph: Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Any]],
    wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    fullgraph: bool,
) -> CaptureResult:
    start = time.perf_counter()
    try:
        traced = trace_frame(fn, tuple(args), dict(kwargs or {}))
    except Unsupported as e:
        counters.bump("graph_break", e.kind)
        if fullgraph:
            raise
        from kiln.capture.breaks import capture_after_break  # it builds on this module

        return capture_after_break(
            e,
            fn,
            tuple(args),
            compile_graph=compile_graph,
            wrap_callable=wrap_callable,
            started=start,
        )
    traced_at = time.perf_counter()
    out, func = traced.out, traced.func
    effects = out.side_effects
    outputs = graph_outputs(traced.result, effects)
    graphs: list[fx.GraphModule] = []
    compiled, mode_after = None, None
    if out.has_ops() or outputs:
        gm = out.finish(outputs)
        graph_log.debug("captured graph of %s:\n%s", func.__qualname__, gm.code)
        graphs.append(gm)
        compiled = compile_graph(gm, [i.real for i in out.inputs])
        mode_after = grad_mode_after(gm)
    compiled_at = time.perf_counter()
    code = emit_code(func, compiled, out.inputs, outputs, traced.result, effects, mode_after)
    log_code(f"original {func.__qualname__}", func.__code__)
    log_code(f"transformed {func.__qualname__}", code)
    guards = [*out.guards(), GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current())]
    new_fn = types.FunctionType(
        code, func.__globals__, func.__name__, func.__defaults__, func.__closure__
    )
    new_fn.__kwdefaults__ = func.__kwdefaults__
    new_fn.__qualname__ = func.__qualname__
    function: Callable[..., Any] = new_fn
    if isinstance(fn, types.MethodType):
        function = types.MethodType(new_fn, fn.__self__)
    counters.bump("capture", "frames")
    counters.bump("capture", "graphs", len(graphs))
    return CaptureResult(
        code=code,
        function=function,
        graphs=graphs,
        guards=guards,
        side_effects=effects.describe(),
        timings={
            "trace": traced_at - start,
            "compile": compiled_at - traced_at,
            "emit": time.perf_counter() - compiled_at,
        },
    )
