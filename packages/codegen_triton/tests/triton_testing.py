"""Test helpers: ATen programs compiled by loopir with the Triton backend, checked against eager."""

from __future__ import annotations

import torch
import torch.fx

from kiln.codegen_triton import TritonBackend
from kiln.loopir.pipeline import CompiledGraph, compile_graph
from kiln.loopir.scheduler.order import KernelStep

aten = torch.ops.aten


def to_meta(t):
    if isinstance(t, torch.Tensor):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def aten_graph(fn, *inputs) -> torch.fx.GraphModule:
    """``fn`` (calling ``torch.ops.aten.*``) traced, ``meta['val']`` on every node."""
    gm = torch.fx.symbolic_trace(fn)

    class Fill(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            n.meta["val"] = result
            return result

    Fill(gm).run(*[to_meta(t) for t in inputs])
    return gm


def compile_fn(fn, *inputs, backend: TritonBackend | None = None) -> CompiledGraph:
    gm = aten_graph(fn, *inputs)
    # fake inputs carry no device here: real CUDA tensors tell loopir where kernels run
    examples = [t if getattr(t, "is_cuda", False) else to_meta(t) for t in inputs]
    return compile_graph(gm, examples, backend=backend or TritonBackend())


def check(fn, *inputs, atol=None, rtol=None, backend=None) -> CompiledGraph:
    """Compile ``fn`` with the Triton backend, run it, compare with eager on the same inputs."""
    compiled = compile_fn(fn, *inputs, backend=backend)
    expected = fn(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    return compiled


def kernel_sources(compiled: CompiledGraph) -> list[str]:
    return [s.code.source for s in compiled.steps if isinstance(s, KernelStep)]
