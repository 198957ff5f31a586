"""Symbolic sizes: one compiled kernel serves every shape; sizes come from the tensors."""

from __future__ import annotations

import pytest
import sympy
import torch

from kiln.codegen_cpp import CodegenCppError, CppBackend
from kiln.codegen_cpp.kernel import KernelWriter
from kiln.loopir.ir.buffers import ComputedBuffer, InputBuffer
from kiln.loopir.ir.layout import contiguous_layout
from kiln.loopir.ir.loops import Pointwise, Reduction
from kiln.loopir.kernel import KernelGroup, KernelNode
from kiln.loopir.virtualized import ops

CPU = torch.device("cpu")
F32 = torch.float32
S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)


def _input(name, size):
    return InputBuffer(name, contiguous_layout(CPU, F32, size, flexible=False))


def _pointwise_group():
    a, b = _input("a", (S0, S1)), _input("b", (S1,))
    la, lb = a.make_loader(), b.make_loader()
    out = ComputedBuffer(
        "buf0",
        contiguous_layout(CPU, F32, (S0, S1)),
        Pointwise(CPU, F32, (S0, S1), "add", lambda i: ops.add(ops.tanh(la(i)), lb([i[1]]))),
    )
    layouts = {"a": a.layout, "b": b.layout, "buf0": out.layout}
    node = KernelNode(out, "x", sympy.S.One)
    return KernelGroup(
        "dyn_add", CPU, S0 * S1, sympy.S.One, (node,), layouts, ("a", "b"), ("buf0",)
    )


def _reduction_group(rows_are_reduced: bool):
    """Row sums (reduce s1) or column sums (reduce s0) of an [s0, s1] input."""
    x = _input("x", (S0, S1))
    lx = x.make_loader()
    keep, red = (S1, S0) if rows_are_reduced else (S0, S1)

    def fn(i, r):
        return lx([r[0], i[0]] if rows_are_reduced else [i[0], r[0]])

    out = ComputedBuffer(
        "buf0",
        contiguous_layout(CPU, F32, (keep,)),
        Reduction(CPU, F32, (keep,), "sum", (red,), "sum", F32, fn),
    )
    layouts = {"x": x.layout, "buf0": out.layout}
    node = KernelNode(out, "xr", red)
    return KernelGroup("dyn_sum", CPU, keep, red, (node,), layouts, ("x",), ("buf0",))


@pytest.fixture(scope="module")
def kernels():
    backend = CppBackend()
    made = {
        "add": backend.codegen_kernel(_pointwise_group()).fn,
        "colsum": backend.codegen_kernel(_reduction_group(True)).fn,
        "rowsum": backend.codegen_kernel(_reduction_group(False)).fn,
    }
    backend.finalize()
    return made


@pytest.mark.parametrize("shape", [(5, 37), (64, 130), (1, 3)])
def test_one_kernel_serves_every_shape(kernels, shape):
    a, b = torch.randn(shape), torch.randn(shape[1])
    out = torch.empty(shape)
    kernels["add"](a, b, out)
    torch.testing.assert_close(out, torch.tanh(a) + b)
    col, row = torch.empty(shape[1]), torch.empty(shape[0])
    kernels["colsum"](a, col)
    kernels["rowsum"](a, row)
    torch.testing.assert_close(col, a.sum(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(row, a.sum(1), atol=1e-5, rtol=1e-5)


def test_sizes_become_parameters():
    text = KernelWriter(_pointwise_group(), "k", 16).generate()
    assert "int64_t s0, int64_t s1, int64_t nthreads" in text
    assert "if(s0 * s1 * 1 >= " in text or "if(" in text


def _with_numel_times(symbol):
    group = _pointwise_group()
    return KernelGroup(
        group.name,
        CPU,
        group.numel * symbol,
        group.rnumel,
        group.nodes,
        group.buffers,
        group.inputs,
        group.outputs,
    )


def test_size_no_tensor_carries_is_a_size_argument():
    """A size symbol no argument's shape holds is passed by the caller after the tensors."""
    writer = KernelWriter(
        _with_numel_times(sympy.Symbol("s9", integer=True, positive=True)), "k", 16
    )
    assert writer.size_args == ("s9",)
    assert "int64_t s0, int64_t s1, int64_t s9, int64_t nthreads" in writer.generate()


def test_symbol_no_one_can_pass_is_reported():
    with pytest.raises(CodegenCppError, match="q9"):
        KernelWriter(_with_numel_times(sympy.Symbol("q9", integer=True, positive=True)), "k", 16)


S2 = sympy.Symbol("s2", integer=True, positive=True)


def _channel_scale_group():
    """``x[n, c, h, w] * scale[c]`` over symbolic n, h, w: the channel digit of the flat
    index has a symbolic divisor (h*w)."""
    x, scale = _input("x", (S0, sympy.Integer(3), S1, S2)), _input("scale", (sympy.Integer(3),))
    lx, ls = x.make_loader(), scale.make_loader()
    size = (S0, sympy.Integer(3), S1, S2)
    out = ComputedBuffer(
        "buf0",
        contiguous_layout(CPU, F32, size),
        Pointwise(CPU, F32, size, "mul", lambda i: ops.mul(lx(i), ls([i[1]]))),
    )
    layouts = {"x": x.layout, "scale": scale.layout, "buf0": out.layout}
    node = KernelNode(out, "x", sympy.S.One)
    numel = S0 * 3 * S1 * S2
    return KernelGroup(
        "dyn_scale", CPU, numel, sympy.S.One, (node,), layouts, ("x", "scale"), ("buf0",)
    )


def test_symbolic_rows_read_a_channel_once_per_row():
    """Rows of a symbolic length: the channel's scale is read once per row (not gathered
    per lane), and the kernel is right for sizes whose rows are shorter than a vector."""
    group = _channel_scale_group()
    text = KernelWriter(group, "k", 8).generate()
    assert "xrow" in text and "xcol" in text
    assert "from_lanes" not in text and "gather" not in text
    backend = CppBackend()
    fn = backend.codegen_kernel(group).fn
    backend.finalize()
    for shape in [(2, 3, 5, 7), (1, 3, 1, 1), (3, 3, 4, 16), (2, 3, 9, 3)]:
        x, scale = torch.randn(shape), torch.randn(3)
        out = torch.empty(shape)
        fn(x, scale, out)
        torch.testing.assert_close(out, x * scale.view(1, 3, 1, 1))
