"""``capture()``: one call of a Python function to a graph, guards and new code.

This is the entry the frontend calls on a cache miss. It binds the real
arguments, traces the function symbolically (inlining what it calls),
closes the graph, hands it to ``compile_graph`` with the real tensors as
example inputs, and emits a code object that calls the compiled graph.
Where it meets something it cannot model, :mod:`kiln.capture.breaks.split` splits
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

from kiln.capture import (  # noqa: F401  (evaluator fills the dispatch tables)
    counters,
    evaluator,
    function_modes,
)
from kiln.capture.binding import code_signature
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.breaks.rollback import BreakTracer, break_state
from kiln.capture.breaks.split import capture_after_break
from kiln.capture.emit import emit_code, graph_outputs
from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.graph import DATA_ARGUMENTS, EAGER_RANDOM, OutputGraph
from kiln.capture.guard_data import user_function_modes
from kiln.capture.isolation import no_user_hooks, older_objects_spared
from kiln.capture.result import (
    CaptureResult,
    CompileGraph,
    GraphBreak,
    close_capture,
    compile_partial,
    split_method,
)
from kiln.capture.source import ClosureSource, LocalSource
from kiln.capture.torch_functions import Site, answering_compiling
from kiln.capture.tracer import CO_GENERATOR_LIKE
from kiln.capture.values.base import Value
from kiln.capture.values.containers import CellValue
from kiln.capture.wrap import wrap

__all__ = ["CaptureResult", "GraphBreak", "capture", "trace_frame"]

# places where ``torch.compiler.is_compiling()`` may answer as in eager, one per new trace
_EAGER_ANSWERS = 3

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TracedFrame:
    """A finished trace: the graph under construction, its inputs and the returned value."""

    out: OutputGraph
    result: Value
    func: types.FunctionType


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
    """Trace one call of ``fn`` symbolically; raise :class:`Unsupported` if it cannot.

    The trace answers ``torch.compiler.is_compiling()`` with True, so library code takes the
    path it wrote for compilers. Where that path raises an exception the frame does not
    catch (a default mask eager builds is left None), eager's path may not: the frame is
    traced again with the last place that asked before the exception answering False, as
    in eager, a few places at most, and gives up when eager's answers raise too.
    """
    eager_sites: frozenset[Site] = frozenset()
    for _ in range(_EAGER_ANSWERS):
        with answering_compiling(eager_sites) as answer:
            try:
                return _trace(fn, args, kwargs)
            except Unsupported as e:
                new = [s for s in answer.asked if s not in eager_sites]
                if not new or e.kind != "user_exception" or break_state(e) is not None:
                    raise
                log.info("%s on the compiled path; tracing eager's answer there", e)
                eager_sites |= {new[-1]}
    with answering_compiling(eager_sites):
        return _trace(fn, args, kwargs)


def _trace(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TracedFrame:
    func, args = split_method(fn, args)
    code = func.__code__
    if code.co_flags & CO_GENERATOR_LIKE:
        raise unsupported("unsupported_call", f"generator or coroutine {code.co_qualname}")
    if user_function_modes():
        # the graph would run its ops without the mode; eager runs them through it
        raise unsupported("unsupported_context", "a torch-function mode active at the call")
    grad_mode = torch.is_grad_enabled()
    out = OutputGraph()
    out.eager_random = bool(getattr(func, EAGER_RANDOM, False))
    from_data = getattr(func, DATA_ARGUMENTS, None)
    if from_data:
        out.dynamic = dataclasses.replace(out.dynamic, from_data=from_data)
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
    except (Unsupported, EagerRaises):
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


@counters.phase("capture")
def capture(
    fn: Callable[..., Any],
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None,
    *,
    compile_graph: CompileGraph,
    wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    fullgraph: bool = False,
) -> CaptureResult:
    """Capture one call of ``fn`` (a function or bound method); see the package README."""
    with no_user_hooks(), older_objects_spared():
        return _capture(fn, args, kwargs, compile_graph, wrap_callable, fullgraph)


def _capture(
    fn: Callable[..., Any],
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None,
    compile_graph: CompileGraph,
    wrap_callable: Callable[[Callable[..., Any]], Callable[..., Any]],
    fullgraph: bool,
) -> CaptureResult:
    start = time.perf_counter()
    try:
        traced = trace_frame(fn, tuple(args), dict(kwargs or {}))
    except Unsupported as e:
        counters.bump("graph_break", e.kind)
        state = break_state(e)
        # a frame that only calls a DDP/FSDP2 module is split with fullgraph too: it hands
        # over to the wrapped forward, compiled (whole, under fullgraph) on its own
        handover = e.kind == "distributed_module"
        if (fullgraph and not handover) or (
            state is not None and function_modes.open_at(state.tracer.out, state.index)
        ):
            raise
        split = capture_after_break(
            e,
            fn,
            tuple(args),
            compile_graph=compile_graph,
            wrap_callable=wrap_callable,
            started=start,
        )
        if fullgraph and (split.graph_breaks or split.graphs):
            raise e from None
        return split
    traced_at = time.perf_counter()
    out, func = traced.out, traced.func
    outputs = graph_outputs(traced.result, out.side_effects, out)
    graph = compile_partial(out, outputs, func, compile_graph)
    compiled_at = time.perf_counter()
    code = emit_code(
        func,
        graph.compiled,
        out.inputs,
        outputs,
        traced.result,
        out.side_effects,
        graph.grad_mode_after,
    )
    timings = {
        "trace": traced_at - start,
        "compile": compiled_at - traced_at,
        "emit": time.perf_counter() - compiled_at,
    }
    return close_capture(fn, func, code, out, graph.graphs, [], timings)
