"""Test helpers: ATen graphs from plain functions, compiled with the reference backend."""

from __future__ import annotations

import importlib
import os

import torch
import torch.fx

from kiln.loopir import ReferenceBackend, get_backend, register_backend
from kiln.loopir.pipeline import CompiledGraph, compile_graph

# KILN_LOOPIR_TEST_BACKEND picks the backend this suite compiles with, so that its
# eager-parity tests (the lowering corpus, ``nox -s lowering-corpus``) check a code
# generator: unset, loopir's reference backend; ``registered``, the code generator
# registered for the CPU; ``module:Class``, that backend class, registered for the CPU
# too (``kiln.codegen_triton:TritonBackend`` under TRITON_INTERPRET=1).
_CHOICE = os.environ.get("KILN_LOOPIR_TEST_BACKEND", "")
_CODEGEN = None
if ":" in _CHOICE:
    _module, _, _name = _CHOICE.partition(":")
    _CODEGEN = getattr(importlib.import_module(_module), _name)
    register_backend("cpu", _CODEGEN)


def suite_backend():
    if _CODEGEN is not None:
        return _CODEGEN()
    return get_backend("cpu") if _CHOICE == "registered" else ReferenceBackend()


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
