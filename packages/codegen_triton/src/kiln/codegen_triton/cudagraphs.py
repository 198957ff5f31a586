"""CUDA graphs for ``mode="reduce-overhead"``: record a compiled graph once, replay it.

Replaying removes the per-kernel launch cost from Python, but only when the
graph does the same thing every call: every tensor on the GPU, no host
synchronisation, no host-drawn random seeds (they would be frozen into the
recording), and no writes into the caller's tensors (the recording writes into
static copies). :func:`unsafe_reason` checks those rules over the compiled
steps; :func:`cudagraphify` wraps the compiled callable when they hold and logs
the reason and launches normally otherwise.

A recording holds one set of sizes. A graph compiled over symbolic sizes is recorded once
per distinct set of input shapes and strides it is called with; the :data:`GRAPHS_KEPT` most
recently used recordings are kept (each holds its static inputs, outputs and memory pool),
and a set of sizes seen again after its recording was dropped is recorded again.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.capture import counters
from kiln.loopir import symbolic
from kiln.loopir.kernel import SEEDS
from kiln.loopir.scheduler.order import ExternStep, KernelStep
from kiln.loopir.wrapper import clone_strided, current_region

__all__ = ["GRAPHS_KEPT", "SYNCING_OPS", "unsafe_reason", "CudaGraphRunner", "cudagraphify"]

log = logging.getLogger("kiln.codegen_triton.cudagraphs")

SYNCING_OPS = (
    "nonzero", "_local_scalar_dense", "item", "masked_select", "unique", "bincount",
    "repeat_interleave", "histc", "argwhere",
)  # fmt: skip
"""ATen ops whose output size or value needs the host: they cannot be recorded."""

GRAPHS_KEPT = 8
"""Recordings kept per compiled graph over symbolic sizes, least recently used dropped first."""


def _is_cuda(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"


def unsafe_reason(
    steps: Iterable[Any], input_names: Sequence[str], inputs: Sequence[Any]
) -> str | None:
    """Why the steps of a compiled graph cannot be recorded as a CUDA graph (None: they can)."""
    for i, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            return f"input {i} is a {type(value).__name__}, not a tensor (it would be frozen)"
        if not _is_cuda(value):
            return f"input {i} is on {value.device}, not a CUDA device"
    graph_inputs = set(input_names)
    for step in steps:
        if isinstance(step, KernelStep):
            reason = _kernel_reason(step, graph_inputs)
        elif isinstance(step, ExternStep):
            reason = _extern_reason(step)
        else:
            reason = None
        if reason is not None:
            return reason
    return None


def _kernel_reason(step: KernelStep, graph_inputs: set[str]) -> str | None:
    group = step.group
    if group.device.type != "cuda":
        return f"kernel {group.name} runs on {group.device}"
    if SEEDS in group.inputs:
        return f"kernel {group.name} uses random seeds drawn on the host each call"
    mutated = graph_inputs.intersection(group.outputs)
    if mutated:
        return f"kernel {group.name} writes into graph input(s) {sorted(mutated)}"
    return None


def _extern_reason(step: ExternStep) -> str | None:
    op = str(step.buffer.op)
    name = op.split(".")[-2] if "." in op else op
    if name in SYNCING_OPS or any(name == f"{s}_" for s in SYNCING_OPS):
        return f"{op} synchronises with the host"
    for value in pytree.tree_leaves((step.buffer.args, step.buffer.kwargs)):
        device = getattr(value, "device", None)
        if isinstance(device, torch.device) and device.type == "cpu":
            return f"{op} takes a CPU tensor"
    return None


class CudaGraphRunner:
    """One recording of ``fn`` replayed per call.

    Parameters keep their storage between calls, so the recording reads them in place;
    every other input is copied into a static buffer before each replay. A parameter
    whose storage moved (replaced, or ``.data`` swapped) makes the runner record again.
    """

    def __init__(self, fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> None:
        self.fn = fn
        self._record(inputs)

    def _record(self, inputs: Sequence[torch.Tensor]) -> None:
        kept = [_in_place(t) for t in inputs]
        self.static_inputs = [
            t if k else clone_strided(t) for t, k in zip(inputs, kept, strict=True)
        ]
        self._copied = [i for i, k in enumerate(kept) if not k]
        self._kept = [i for i, k in enumerate(kept) if k]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.fn(*self.static_inputs)  # compiles and autotunes outside the recording
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_outputs = self.fn(*self.static_inputs)
        counters.bump("codegen_triton", "cudagraphs_recorded")

    def __call__(self, *args: torch.Tensor) -> Any:
        statics = self.static_inputs
        if any(statics[i].data_ptr() != args[i].data_ptr() for i in self._kept):
            log.info("a parameter's storage moved: recording the CUDA graph again")
            self._record(args)
        for i in self._copied:
            if statics[i].data_ptr() != args[i].data_ptr():
                statics[i].copy_(args[i])
        self.graph.replay()
        # the next replay overwrites the static outputs: hand out copies
        return pytree.tree_map_only(torch.Tensor, torch.clone, self.static_outputs)


def _has_symbolic_sizes(steps: Iterable[Any]) -> bool:
    """Whether a compiled graph's buffers have symbolic sizes (one recording per size set)."""
    exprs: list[Any] = []
    for step in steps:
        group = getattr(step, "group", None)
        if group is not None:
            exprs += [group.numel, group.rnumel]
            layouts = getattr(group, "buffers", {}).values()
            exprs += [s for layout in layouts for s in layout.size]
        layout = getattr(getattr(step, "buffer", None), "layout", None)
        if layout is not None:
            exprs += list(layout.size)
    return bool(symbolic.size_symbols(sympy.sympify(e) for e in exprs))


def _in_place(t: torch.Tensor) -> bool:
    """Inputs the recording reads where they are: parameters, whose storage stays put."""
    return isinstance(t, torch.nn.Parameter)


def cudagraphify(compiled: Any, inputs: Sequence[Any] = ()) -> Callable[..., Any]:
    """``compiled`` (a loopir ``CompiledGraph``) replayed from a CUDA graph when safe.

    The decision is taken on the first call, with real tensors (example inputs
    may be fake); when unsafe the reason is logged and ``compiled`` runs as is.
    """
    steps = getattr(compiled, "steps", ())
    names = [n for n in getattr(compiled, "input_names", ()) if n is not None]
    region = current_region()  # the user's function and graph, for the message
    how: list[str] = []  # "one" recording, one "per_size", or "launch" (unsafe)
    runner: list[CudaGraphRunner] = []
    per_size: collections.OrderedDict[Any, CudaGraphRunner] = collections.OrderedDict()

    def by_size(args: Sequence[Any]) -> Any:
        key = tuple([(a.shape, a.stride()) for a in args])
        found = per_size.get(key)
        if found is None:
            if len(per_size) >= GRAPHS_KEPT:
                per_size.popitem(last=False)
            found = per_size[key] = CudaGraphRunner(compiled, args)
        else:
            per_size.move_to_end(key)
        return found(*args)

    def run(*args: Any) -> Any:
        if not how:
            reason = unsafe_reason(steps, names, args)
            if reason is None and not torch.cuda.is_available():
                reason = "CUDA is not available"
            if reason is not None:
                # said at the default level on CUDA (once per graph: the decision is kept);
                # a graph with no CUDA tensor was said by the frontend, for the whole mode
                on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
                level = logging.WARNING if on_cuda else logging.INFO
                log.log(level, "%s runs without CUDA graphs: %s", region, reason)
                how.append("launch")
            else:
                how.append("per_size" if _has_symbolic_sizes(steps) else "one")
        if how[0] == "one":
            if not runner:
                runner.append(CudaGraphRunner(compiled, args))
            return runner[0](*args)
        return by_size(args) if how[0] == "per_size" else compiled(*args)

    run.__wrapped__ = compiled  # type: ignore[attr-defined]
    return run
