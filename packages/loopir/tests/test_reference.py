"""The reference backend evaluates hand-built kernels like eager PyTorch."""

import pytest
import sympy
import torch

from kiln.loopir.errors import IRVerificationError
from kiln.loopir.ir.buffers import ComputedBuffer, InputBuffer
from kiln.loopir.ir.layout import contiguous_layout
from kiln.loopir.ir.loops import Pointwise, Reduction
from kiln.loopir.kernel import KernelGroup, KernelNode
from kiln.loopir.printing import render_group
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.virtualized import ops

CPU = torch.device("cpu")
S = sympy.Integer


def _softmax_group():
    n, d = S(3), S(5)
    x = InputBuffer("x", contiguous_layout(CPU, torch.float32, (n, d), flexible=False))
    load = x.make_loader()
    mx = ComputedBuffer(
        "buf0",
        contiguous_layout(CPU, torch.float32, (n,)),
        Reduction(
            CPU,
            torch.float32,
            (n,),
            "amax",
            (d,),
            "max",
            torch.float32,
            lambda i, r: load([i[0], r[0]]),
        ),
    )
    mload = mx.make_loader()
    out = ComputedBuffer(
        "buf1",
        contiguous_layout(CPU, torch.float32, (n, d)),
        Pointwise(
            CPU, torch.float32, (n, d), "sub", lambda i: ops.exp(ops.sub(load(i), mload([i[0]])))
        ),
    )
    layouts = {"x": x.layout, "buf0": mx.layout, "buf1": out.layout}
    nodes = (KernelNode(mx, "xr", d), KernelNode(out, "xr", d))
    return KernelGroup("kernel0", CPU, n, d, nodes, layouts, ("x",), ("buf0", "buf1"))


def test_reduction_then_pointwise_in_one_kernel():
    group = _softmax_group()
    code = ReferenceBackend().codegen_kernel(group)
    x = torch.randn(3, 5)
    b0, b1 = torch.empty(3), torch.empty(3, 5)
    code.fn(x, b0, b1)
    torch.testing.assert_close(b0, x.amax(1))
    torch.testing.assert_close(b1, (x - x.amax(1, keepdim=True)).exp())


def test_render_group_shows_flat_indices():
    text = render_group(_softmax_group())
    assert "reduction(max" in text
    assert "store_reduction(buf0, xindex" in text
    assert "load(x, rindex + 5*xindex)" in text


def _shifted_copy_group(masked: bool):
    """``out[i] = x[i - 2]`` over 6 lanes of a 4-element ``x``, the load masked to
    ``i >= 2`` (or not): what a generated kernel reads, the ``where`` after it aside."""
    x = InputBuffer("x", contiguous_layout(CPU, torch.float32, (S(4),), flexible=False))
    load = x.make_loader()

    def body(i):
        keep = ops.ge(ops.index_expr(i[0], torch.int64), ops.constant(2, torch.int64))
        value = ops.masked(keep, lambda: load([i[0] - 2]), 0) if masked else load([i[0] - 2])
        return ops.where(keep, value, ops.constant(0.0, torch.float32))

    out = ComputedBuffer(
        "buf0",
        contiguous_layout(CPU, torch.float32, (S(6),)),
        Pointwise(CPU, torch.float32, (S(6),), "cat", body),
    )
    layouts = {"x": x.layout, "buf0": out.layout}
    nodes = (KernelNode(out, "x", S(1)),)
    return KernelGroup("kernel0", CPU, S(6), S(1), nodes, layouts, ("x",), ("buf0",))


def test_loads_outside_the_buffer_on_unmasked_lanes_raise():
    """A load whose lanes outside the buffer are discarded only by a later ``where`` is
    still a read of memory the buffer does not own in generated code (an illegal memory
    access on a GPU): the reference backend refuses it, and accepts it masked."""
    x, out = torch.arange(4.0), torch.empty(6)
    code = ReferenceBackend().codegen_kernel(_shifted_copy_group(masked=False))
    with pytest.raises(IRVerificationError, match=r"reads x at xindex - 2 outside its 4 elements"):
        code.fn(x, out)
    code = ReferenceBackend().codegen_kernel(_shifted_copy_group(masked=True))
    code.fn(x, out)
    torch.testing.assert_close(out, torch.tensor([0.0, 0, 0, 1, 2, 3]))
