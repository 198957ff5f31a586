"""The reference backend evaluates hand-built kernels like eager PyTorch."""

import sympy
import torch

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
