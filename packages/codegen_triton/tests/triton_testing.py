"""Test helpers: ATen programs compiled by loopir with the Triton backend, checked against eager
(:mod:`kiln.loopir.testing` with the Triton backend by default)."""

from __future__ import annotations

import torch

from kiln.codegen_triton import TritonBackend
from kiln.loopir import testing
from kiln.loopir.pipeline import CompiledGraph
from kiln.loopir.scheduler.order import KernelStep
from kiln.loopir.testing import aten_graph, to_meta

__all__ = ["aten", "aten_graph", "check", "compile_fn", "kernel_sources", "to_meta"]

aten = torch.ops.aten


def compile_fn(fn, *inputs, backend: TritonBackend | None = None) -> CompiledGraph:
    return testing.compile_fn(fn, *inputs, backend=backend or TritonBackend())


def check(fn, *inputs, atol=None, rtol=None, backend=None) -> CompiledGraph:
    """Compile ``fn`` with the Triton backend, run it, compare with eager on the same inputs."""
    return testing.check(fn, *inputs, atol=atol, rtol=rtol, backend=backend or TritonBackend())


def kernel_sources(compiled: CompiledGraph) -> list[str]:
    return [s.code.source for s in compiled.steps if isinstance(s, KernelStep)]
