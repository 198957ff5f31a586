"""Test helpers: ATen graphs from plain functions, compiled with the reference backend."""

from __future__ import annotations

import torch
import torch.fx

from kiln.loopir import ReferenceBackend
from kiln.loopir.pipeline import CompiledGraph, compile_graph


def to_meta(t):
    if isinstance(t, torch.Tensor):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def aten_graph(fn, *inputs) -> torch.fx.GraphModule:
    """``fn`` (calling ``torch.ops.aten.*``) traced, ``meta['val']`` on every node."""
    gm = torch.fx.symbolic_trace(fn)
    metas = [to_meta(t) for t in inputs]

    class Fill(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            n.meta["val"] = result
            return result

    Fill(gm).run(*metas)
    return gm


def compile_fn(fn, *inputs) -> CompiledGraph:
    gm = aten_graph(fn, *inputs)
    return compile_graph(gm, [to_meta(t) for t in inputs], backend=ReferenceBackend())


def check(fn, *inputs, atol=None, rtol=None, equal_nan=True) -> CompiledGraph:
    """Compile ``fn``, run it, and compare with eager on the same inputs."""
    compiled = compile_fn(fn, *inputs)
    expected = fn(*inputs)
    actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
    return compiled
