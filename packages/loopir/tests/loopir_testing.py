"""Test helpers: ATen graphs from plain functions, compiled with the reference backend."""

from __future__ import annotations

import os

import torch
import torch.fx

from kiln.loopir import ReferenceBackend, get_backend
from kiln.loopir.pipeline import CompiledGraph, compile_graph

# KILN_LOOPIR_TEST_BACKEND=registered runs this suite through the code generator
# registered for each device instead of the reference backend (for codegen authors)
_USE_REGISTERED = os.environ.get("KILN_LOOPIR_TEST_BACKEND") == "registered"


def suite_backend():
    return get_backend("cpu") if _USE_REGISTERED else ReferenceBackend()


def to_meta(t):
    if isinstance(t, torch.Tensor):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def aten_graph(fn, *inputs) -> torch.fx.GraphModule:
    """``fn`` (ATen or torch-level calls) traced, a meta ``meta["val"]`` on every node."""
    gm = torch.fx.symbolic_trace(fn)
    metas = [to_meta(t) for t in inputs]

    fill_meta(gm, metas)
    return gm


def fill_meta(gm, metas):
    class Fill(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n.op == "get_attr":
                result = to_meta(result)
            n.meta["val"] = result
            return result

    Fill(gm).run(*metas)


def graph_of_calls(n_inputs, calls):
    """A graph calling each ``(op, args, kwargs)`` (``Input(i)`` names a placeholder) and
    returning every result: for ops that take no tensor, which tracing would fold away."""
    g = torch.fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n_inputs)]
    outs = []
    for op, args, kwargs in calls:
        args = [xs[a.i] if isinstance(a, Input) else a for a in args]
        outs.append(g.call_function(op, tuple(args), kwargs))
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


class Input:
    def __init__(self, i):
        self.i = i


def check_calls(calls, *inputs, **tol):
    gm = graph_of_calls(len(inputs), calls)
    metas = [to_meta(t) for t in inputs]
    fill_meta(gm, metas)
    compiled = compile_graph(gm, metas, backend=suite_backend())
    torch.testing.assert_close(compiled(*inputs), gm(*inputs), **tol)
    return compiled


def compile_fn(fn, *inputs) -> CompiledGraph:
    gm = aten_graph(fn, *inputs)
    return compile_graph(gm, [to_meta(t) for t in inputs], backend=suite_backend())


def check(fn, *inputs, atol=None, rtol=None, equal_nan=True) -> CompiledGraph:
    """Compile ``fn``, run it, and compare with eager on the same inputs."""
    compiled = compile_fn(fn, *inputs)
    expected = fn(*inputs)
    actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
    return compiled
