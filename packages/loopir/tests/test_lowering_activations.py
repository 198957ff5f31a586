"""Directly lowered activations, their backwards and composite elementwise ops vs eager."""

import pytest
import torch
from loopir_testing import check

from kiln.capture import counters

aten = torch.ops.aten


def _activations(x, g, u):
    return (
        aten.gelu.default(x),
        aten.gelu.default(x, approximate="tanh"),
        aten.gelu_backward.default(g, x),
        aten.gelu_backward.default(g, x, approximate="tanh"),
        aten.silu.default(x),
        aten.silu_backward.default(g, x),
        aten.sigmoid_backward.default(g, aten.sigmoid.default(x)),
        aten.tanh_backward.default(g, aten.tanh.default(x)),
        aten.threshold.default(x, 0.5, -1.0),
        aten.threshold_backward.default(g, x, 0.0),
        aten.leaky_relu.default(x, 0.2),
        aten.leaky_relu_backward.default(g, x, 0.2, False),
        aten.hardsigmoid.default(x),
        aten.hardswish.default(x),
        aten.elu.default(x, 1.5, 1.0, 1.0),
        aten.softplus.default(x, 2.0, 5.0),
        aten.mish.default(x),
        aten.logit.default(u),
        aten.logit.default(u, 0.2),
        # Past eps = 0.5 the bounds cross: ATen tests x < eps first, so every x becomes eps.
        aten.logit.default(u, 0.6),
        aten.logit.default(x, -0.5),
        aten.logit_backward.default(g, u),
        aten.logit_backward.default(g, u, 0.3),
        aten.logit_backward.default(g, u, 0.6),
        aten.logit_backward.default(g, x),
        aten.logit_backward.default(g, x, -0.5),
        aten.fmax.default(x, g),
        aten.fmin.default(x, g),
        aten.logaddexp.default(x, g),
        aten.logaddexp2.default(x, g),
        aten.heaviside.default(aten.round.default(x), g),
        aten.xlogy.Tensor(u, u),
        aten.deg2rad.default(x),
        aten.rad2deg.default(x),
        aten.positive.default(x),
        aten.sgn.default(x),
        aten.sinc.default(x),
        aten.addcmul.default(x, g, u, value=0.5),
        aten.addcdiv.default(x, g, u, value=2),
        aten.rsub.Tensor(x, g, alpha=2),
        aten.rsub.Scalar(x, 3),
        aten.nan_to_num.default(aten.log.default(x)),
        aten.nan_to_num.default(aten.div.Tensor(x, aten.round.default(g)), 1.0, 2.0, -2.0),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_activations(dtype, layout):
    def make(scale=3.0):
        t = torch.randn(6, 5) * scale if layout == "contiguous" else (torch.randn(5, 6) * scale).t()
        return t.to(dtype)

    u = (torch.rand(6, 5) * 0.8 + 0.1).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    check(_activations, make(), make(1.0), u, **tol)


def test_scatter_views_and_copies():
    x, s = torch.randn(5, 6), torch.randn(5, 2)
    r = torch.randn(6)

    def fn(x, s, r):
        return (
            aten.slice_scatter.default(x, s, 1, 1, 5, 2),
            aten.slice_scatter.default(x, s, 1, 4),
            aten.slice_scatter.default(x, aten.slice.Tensor(x, 0, 0, 2), 0, 3),
            aten.select_scatter.default(x, r, 0, -1),
            aten.select_scatter.default(x, aten.select.int(x, 1, 0), 1, 2),
            aten.fill.Scalar(x, 2.5),
            aten.fill.Tensor(x, aten.select.int(r, 0, 1)),
            aten.zero.default(x),
            aten.tril.default(x),
            aten.triu.default(x, 1),
            aten.tril.default(x, -2),
            aten.detach.default(x),
            aten.view_copy.default(x, [30]),
            aten.permute_copy.default(x, [1, 0]),
            aten.expand_copy.default(r, [2, 6]),
            aten.unsqueeze_copy.default(x, 0),
            aten.squeeze_copy.dim(aten.unsqueeze.default(x, 0), 0),
            aten.transpose_copy.int(x, 0, 1),
            aten.t_copy.default(x),
            aten.slice_copy.Tensor(x, 1, 2, 4),
            aten.select_copy.int(x, 0, 3),
            aten.alias_copy.default(x),
            aten.diagonal_copy.default(x, 1),
            aten.diagonal.default(x, -1),
        )

    check(fn, x, s, r)


def test_as_strided_scatter_of_a_1d_tensor_is_a_kernel():
    """Autograd's ``as_strided`` backward writes the gradient over all of a flat zero
    tensor (ConvNeXt's pooled head): lowered, as is a contiguous run at an offset; a
    strided view of a 2-D tensor depends on its memory layout and stays ATen's."""
    flat, g, run, m = torch.randn(24), torch.randn(4, 6), torch.randn(2, 5), torch.randn(4, 6)

    def fn(flat, g, run, m):
        return (
            aten.as_strided_scatter.default(flat, g, [4, 6], [6, 1], 0),
            aten.as_strided_scatter.default(flat, run, [2, 5], [5, 1], 3),
            aten.as_strided_scatter.default(m, run, [2, 5], [5, 1], 3),
        )

    counters.clear()
    check(fn, flat, g, run, m)
    assert counters.snapshot()["fallback_ops"] == {"aten.as_strided_scatter.default": 1}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [0.1, 0.3, 0.45])
def test_logit_backward_at_eps_rounded_to_the_input_dtype(dtype, eps):
    # ATen's bounds are eps and 1 - eps in the input's dtype: an input equal to eps rounded
    # to half precision is inside them (its gradient is not zero).
    lo = torch.tensor(eps, dtype=dtype)
    hi = torch.tensor(1.0, dtype=dtype) - lo
    u = torch.stack([lo, hi, lo * 0.99, hi * 1.01, torch.tensor(0.5, dtype=dtype)])
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.float16, torch.bfloat16) else {}
    check(lambda g, x: aten.logit_backward.default(g, x, eps), torch.ones_like(u), u, **tol)
    check(lambda x: aten.logit.default(x, eps), u, **tol)
