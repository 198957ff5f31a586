"""Differential checks against eager PyTorch, shared by the test modules."""

import copy
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.autograd_aot import aot_eager, verify_aten_graph

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules (freezing_testing)


def _clone(x):
    if not isinstance(x, torch.Tensor):
        return x
    c = x.detach().clone()
    return c.requires_grad_(x.requires_grad)


def _float_tensors(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def run_check(
    fn: Callable,
    inputs: list,
    backend=aot_eager,
    rtol: float = 1e-4,
    atol: float = 1e-5,
):
    """Compile ``fn`` (a function or module) with ``backend``; compare outputs,
    mutated inputs and buffers, and gradients of inputs and parameters with eager."""
    gm = fx.symbolic_trace(fn)
    eager_mod, compiled_mod = copy.deepcopy(gm), copy.deepcopy(gm)
    e_in = [_clone(x) for x in inputs]
    c_in = [_clone(x) for x in inputs]
    compiled = backend(compiled_mod, c_in)
    for program in compiled.variants():
        graphs = [program.forward, program.backward] if program.backward else [program.forward]
        for graph in graphs:
            if isinstance(graph, fx.GraphModule):
                verify_aten_graph(graph)
    expect = eager_mod(*e_in)
    got = compiled(*c_in)
    torch.testing.assert_close(got, expect, rtol=rtol, atol=atol)
    torch.testing.assert_close(c_in, e_in, rtol=rtol, atol=atol)
    torch.testing.assert_close(
        dict(compiled_mod.named_buffers()), dict(eager_mod.named_buffers()), rtol=rtol, atol=atol
    )
    outs_e = [t for t in _float_tensors(expect) if t.requires_grad]
    outs_g = [t for t in _float_tensors(got) if t.requires_grad]
    assert len(outs_e) == len(outs_g)
    if outs_e:
        weights = [torch.randn_like(t) for t in outs_e]
        sum(((o * w).sum() for o, w in zip(outs_e, weights))).backward()
        sum(((o * w).sum() for o, w in zip(outs_g, weights))).backward()
        for a, b in zip(c_in, e_in):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol)
        for (name, a), (_, b) in zip(compiled_mod.named_parameters(), eager_mod.named_parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol, msg=name)
    return compiled


@pytest.fixture
def check():
    torch.manual_seed(0)
    return run_check
