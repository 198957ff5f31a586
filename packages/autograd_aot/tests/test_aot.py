"""aot_compile: what the compilers receive, constants, errors."""

import pytest
import torch
from torch import fx

from kiln.autograd_aot import AotError, aot_compile, aot_eager, aot_eager_decomp_partition
from kiln.autograd_aot.mutation import is_mutation
from kiln.capture.meta import is_fake


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, gm, example_inputs):
        self.calls.append((gm, example_inputs))
        return gm


def test_compilers_get_functional_aten_graphs_and_fakes():
    def fn(x, buf):
        buf.add_(x.detach())
        return torch.softmax(x, -1) * buf

    fw, bw = _Recorder(), _Recorder()
    x, buf = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    compiled = aot_compile(fx.symbolic_trace(fn), [x, buf], fw_compiler=fw, bw_compiler=bw)
    (fw_gm, fw_inputs), (bw_gm, bw_inputs) = fw.calls[0], bw.calls[0]
    assert all(is_fake(t) for t in fw_inputs + bw_inputs)
    assert [t.shape for t in fw_inputs] == [(3, 4), (3, 4)]
    for gm in (fw_gm, bw_gm):
        for node in gm.graph.nodes:
            if node.op == "call_function" and hasattr(node.target, "_schema"):
                assert not is_mutation(node.target)
                assert "val" in node.meta
    expect_buf = buf.clone() + x.detach()
    compiled(x, buf).sum().backward()
    torch.testing.assert_close(buf, expect_buf)
    assert x.grad is not None


def test_non_tensor_inputs_are_constants():
    gm = fx.symbolic_trace(lambda x, n: x * n)
    compiled = aot_eager(gm, [torch.randn(3), 2])
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, 2), x * 2)
    with pytest.raises(AotError, match="non-tensor inputs are constants"):
        compiled(x, 3)


def test_mutated_input_that_requires_grad(check):
    def fn(x, y):
        x.mul_(y)
        return x.sin() + 1

    a, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    for backend in (aot_eager, aot_eager_decomp_partition):
        xe, xc = a * 1, a * 1
        compiled = backend(fx.symbolic_trace(fn), [xc, y])
        expect, got = fn(xe, y), compiled(xc, y)
        torch.testing.assert_close(got, expect)
        torch.testing.assert_close(xc, xe)
        # the mutation is part of the inputs' history: gradients flow through later uses
        (ge_a, ge_y) = torch.autograd.grad((expect + xe * 3).sum(), [a, y])
        (gc_a, gc_y) = torch.autograd.grad((got + xc * 3).sum(), [a, y])
        torch.testing.assert_close(gc_a, ge_a)
        torch.testing.assert_close(gc_y, ge_y)
