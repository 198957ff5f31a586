"""Dynamic shapes in the frontend: which sizes a capture makes symbolic, and backends that
compile static shapes only.

``kiln.compile(dynamic=None)`` (the default) compiles static first; once a frame's inputs
come with a size that changed since an earlier capture, the frame is captured again with that
dimension symbolic (automatic dynamic shapes). ``dynamic=True`` makes every input size
symbolic from the first call (module parameters and buffers stay static); ``dynamic=False``
never makes one symbolic. ``mark_dynamic``, ``maybe_mark_dynamic`` and ``mark_static`` mark a
tensor's dimensions (the marks TorchDynamo's ``mark_dynamic`` leaves are honoured as well).

A backend that declares ``dynamic_shapes = True`` gets graphs with symbolic sizes and
symbolic Python numbers as inputs, and serves every value their guards admit (``"sizes"``:
symbolic sizes only). Any other graph is specialized to each distinct set of input sizes
(and numbers) (:func:`per_size`): one capture still serves them all, and the backend
compiles per set, up to the recompile limit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import fx

from kiln import autograd_aot
from kiln.capture import counters
from kiln.capture.dynamic_dims import (
    STATIC,
    DynamicDims,
    SizeHistory,
    dynamic_dims,
    mark_dynamic,
    mark_static,
    maybe_mark_dynamic,
)
from kiln.capture.errors import Unsupported
from kiln.capture.graph import DATA_DEPENDENT_OPS
from kiln.capture.shapes.dispatch import has_symbolic_sizes
from kiln.capture.shapes.specialize import has_symbolic_inputs, number_inputs, specialize_graph
from kiln.loopir import StaticShapesOnly

__all__ = [
    "capture_data_dependent",
    "has_unbacked",
    "mark_dynamic",
    "mark_static",
    "maybe_mark_dynamic",
    "numbers_only",
    "per_size",
    "symbolic_or_per_size",
    "policy",
    "unbacked_graph",
    "serves_symbols",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_histories: weakref.WeakKeyDictionary[Any, SizeHistory] = weakref.WeakKeyDictionary()


def policy(dynamic: bool | None, cache: Any, automatic: bool = True) -> DynamicDims:
    """The capture policy of ``kiln.compile(dynamic=...)`` for one frame's ``cache``."""
    if dynamic is False:
        return STATIC
    if not automatic:
        return DynamicDims(every_size=dynamic is True)
    history = _histories.get(cache)
    if history is None:
        history = _histories[cache] = SizeHistory()
    # under dynamic=True the history still serves the Python floats a frame takes: they are
    # symbolic once they change, as under dynamic=None (a resume function's float argument,
    # computed from data, would otherwise recompile for every value)
    return DynamicDims(every_size=dynamic is True, history=history)


def serves_symbols(backend: Any, gm: fx.GraphModule) -> bool:
    """Whether ``backend`` compiles ``gm``'s symbols itself: ``dynamic_shapes = True`` says
    it takes symbolic sizes and symbolic numbers as inputs, ``"sizes"`` the sizes alone."""
    serves = getattr(backend, "dynamic_shapes", False)
    return serves is True or (serves == "sizes" and not number_inputs(gm))


def numbers_only(gm: fx.GraphModule) -> bool:
    """Whether ``gm``'s symbolic inputs are Python numbers alone (its sizes static): the
    default backend compiles it once with each number a kernel argument, even where graphs
    with symbolic sizes are compiled per size (such a graph's kernels are the static ones)."""
    numbers = number_inputs(gm)
    if not numbers:
        return False
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return all(
        not has_symbolic_sizes(n.meta["val"])
        for n in placeholders
        if isinstance(n.meta.get("val"), torch.Tensor)
    )


def with_data_dependent(sizes: DynamicDims, option: Callable[[str, Any], Any]) -> DynamicDims:
    """``sizes`` with the options that keep data-dependent values in the graph."""
    return dataclasses.replace(
        sizes,
        scalar_outputs=option("capture_scalar_outputs", False),
        dynamic_output_shapes=option("capture_dynamic_output_shape_ops", False),
    )


def capture_data_dependent(run: Callable[[], _T], sizes: DynamicDims) -> _T:
    """``run()``, a capture under ``sizes``. A value kept in the graph as an unbacked symbol
    that meets a decision only data settles (``if n > 0:``) breaks the graph there, the graph
    returning it; where that cannot be done (the frame cannot be split there, or the value
    has no graph form to return), the frame is captured again without the options: the
    value breaks the graph where it is made, as by default, rather than the whole frame
    running eagerly."""
    try:
        return run()
    except Unsupported as e:
        keeping = sizes.scalar_outputs or sizes.dynamic_output_shapes
        if e.kind != "data_dependent_branch" or not keeping:
            raise
        log.info("captured again with data-dependent values breaking the graph: %s", e)
    off = dataclasses.replace(sizes, scalar_outputs=False, dynamic_output_shapes=False)
    with dynamic_dims(off):
        return run()


def has_unbacked(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` computes sizes or numbers from tensor data (``capture_scalar_outputs``,
    ``capture_dynamic_output_shape_ops``): no set of input sizes specializes it."""
    return DATA_DEPENDENT_OPS in gm.meta


def data_dependent_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """A graph with unbacked symbols that loopir declined: no per-size specialization serves
    sizes computed from data, so the graph's ATen ops (autograd_aot's, training included)
    run with eager kernels."""
    counters.bump("stats", "data_dependent_graphs")
    return autograd_aot.aot_eager(gm, example_inputs)


def unbacked_graph(
    compile_symbolic: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
) -> Callable[..., Any]:
    """The default backend's program for a graph with unbacked symbols: compiled once by
    loopir, whose wrapper binds each value computed from data from the extern call that
    makes it. Where loopir raises ``StaticShapesOnly`` (while compiling, or on a later call
    that compiles the training program), :func:`data_dependent_graph` runs it instead."""
    try:
        compiled = compile_symbolic(gm, example_inputs)
    except StaticShapesOnly as e:
        log.info("graph with data-dependent sizes runs with ATen kernels: %s", e)
        return data_dependent_graph(gm, example_inputs)

    def with_aten_kernels(e: StaticShapesOnly, args: Sequence[Any]) -> Callable[..., Any]:
        log.info("graph with data-dependent sizes runs with ATen kernels: %s", e)
        return data_dependent_graph(gm, args)

    return _falling_back(compiled, with_aten_kernels)


def _falling_back(
    compiled: Callable[..., Any],
    fallback: Callable[[StaticShapesOnly, Sequence[Any]], Callable[..., Any]],
) -> Callable[..., Any]:
    """``compiled``, until a call raises ``StaticShapesOnly`` (the backend compiling more on
    a later call, such as the training program): that call and every later one run what
    ``fallback`` builds from the exception and the call's arguments."""
    current = [compiled]

    def run(*args: Any) -> Any:
        try:
            return current[0](*args)
        except StaticShapesOnly as e:
            if current[0] is not compiled:
                raise
            current[0] = fallback(e, args)
            return current[0](*args)

    return run


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def per_size(
    compile_static: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    limit: int,
) -> Callable[..., Any]:
    """A callable running ``gm`` (symbolic sizes) through ``compile_static``'s graph for
    each call's sizes, compiling one per new set of sizes; past ``limit`` of them, new
    sizes run the graph itself (eager kernels) with one warning."""
    if not has_symbolic_inputs(gm):
        return compile_static(gm, example_inputs)
    positions = [
        i
        for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")
        if isinstance(n.meta.get("val"), torch.Tensor)
    ]
    numbers = number_inputs(gm)
    compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
    warned = [False]

    def key(args: Sequence[Any]) -> tuple[Any, ...]:
        sizes = tuple((args[i].shape, args[i].stride()) for i in positions)
        # NaN keys by name: a NaN is unequal to itself, and each call passes a new one
        values = tuple("nan" if _is_nan(args[i]) else args[i] for i in numbers)
        return (sizes, values) if numbers else sizes

    def compile_for(args: Sequence[Any]) -> Callable[..., Any]:
        if len(compiled) >= limit:
            if not warned[0]:
                warned[0] = True
                counters.bump("stats", "eager_fallbacks")
                warnings.warn(
                    f"kiln: a graph with dynamic sizes was compiled for {limit} sets of sizes "
                    "(the recompile limit); its backend compiles static shapes only, so new "
                    "sizes run the graph with eager kernels",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return gm.forward
        counters.bump("stats", "size_specializations")
        return compile_static(specialize_graph(gm, args), args)

    def run(*args: Any) -> Any:
        k = key(args)
        fn = compiled.get(k)
        if fn is None:
            fn = compiled[k] = compile_for(args)
        return fn(*args)

    compiled[key(example_inputs)] = compile_for(example_inputs)
    return run


def symbolic_or_per_size(
    compile_static: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    limit: int,
) -> Callable[..., Any]:
    """``gm`` compiled once with its symbolic sizes; where the backend raises
    ``loopir.StaticShapesOnly`` (a construct the default backend compiles for static sizes
    only, found before it ran anything), compiled per set of sizes (:func:`per_size`).
    Only that exception falls back: any other is the backend failing on the graph.

    The backend may compile more on a later call (the training program once a call needs
    gradients): raised there, the call and every later one run per size instead."""
    try:
        compiled = compile_static(gm, example_inputs)
    except StaticShapesOnly as e:
        if not has_symbolic_inputs(gm):
            raise
        return _per_size_after(e, compile_static, gm, example_inputs, limit)
    if not has_symbolic_inputs(gm):
        return compiled
    return _falling_back(
        compiled, lambda e, args: _per_size_after(e, compile_static, gm, args, limit)
    )


def _per_size_after(
    reason: Exception,
    compile_static: Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    limit: int,
) -> Callable[..., Any]:
    log.info("graph compiled per size: %s", reason)
    counters.bump("stats", "static_shape_fallbacks")
    return per_size(compile_static, gm, example_inputs, limit)
