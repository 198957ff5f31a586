"""Composite ops reached through decompositions (softmax, norms, activations) vs eager."""

import pytest
import torch
from loopir_testing import check

from kiln.autograd_aot import default_decompositions
from kiln.loopir import decompositions
from kiln.loopir.lowering import LOWERINGS

aten = torch.ops.aten


def test_table_is_built_from_torch_decomp_minus_lowerings():
    table = decompositions()
    assert aten._softmax.default in table
    assert aten.native_layer_norm.default in table
    assert aten.native_batch_norm.default in table
    assert aten.gelu.default not in table  # lowered directly since it has a lowering
    assert aten.add.Tensor not in table  # lowered directly
    assert aten.var_mean.correction not in table


def test_table_extends_autograd_aots():
    # every op autograd_aot decomposes that loopir does not lower is decomposed here too
    table = decompositions()
    assert set(default_decompositions()) - set(LOWERINGS) <= set(table)
    assert aten.copy.default not in table  # autograd_aot's entry, lowered here
    # torch's bernoulli, whose rand_like loopir lowers, not autograd_aot's seeded draw
    assert table[aten.bernoulli.default].__module__.startswith("torch.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_family(dtype):
    x = torch.randn(4, 7, dtype=dtype)

    def fn(x):
        return (
            aten._softmax.default(x, -1, False),
            aten._softmax.default(x, 0, False),
            aten._log_softmax.default(x, 1, False),
            aten.logsumexp.default(x, [1]),
        )

    tol = {} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}
    check(fn, x, **tol)


def test_norms():
    x, w, b = torch.randn(4, 3, 8), torch.randn(8), torch.randn(8)
    xc, wc, bc = torch.randn(4, 3, 5, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5

    def fn(x, w, b, xc, wc, bc, rm, rv):
        ln = aten.native_layer_norm.default(x, [8], w, b, 1e-5)
        bn = aten._native_batch_norm_legit_no_training.default(xc, wc, bc, rm, rv, 0.1, 1e-5)
        bt = aten._native_batch_norm_legit_functional.default(xc, wc, bc, rm, rv, True, 0.1, 1e-5)
        return (ln[0], ln[1], ln[2], bn[0], bt[0], bt[1], bt[2], bt[3], bt[4])

    check(fn, x, w, b, xc, wc, bc, rm, rv, atol=1e-4, rtol=1e-4)


def test_activations_and_backwards():
    x, g = torch.randn(5, 6) * 3, torch.randn(5, 6)

    def fn(x, g):
        return (
            aten.gelu.default(x),
            aten.gelu.default(x, approximate="tanh"),
            aten.silu.default(x),
            aten.leaky_relu.default(x, 0.1),
            aten.elu.default(x),
            aten.softplus.default(x),
            aten.hardswish.default(x),
            aten.hardsigmoid.default(x),
            aten.mish.default(x),
            aten.sigmoid_backward.default(g, aten.sigmoid.default(x)),
            aten.tanh_backward.default(g, aten.tanh.default(x)),
            aten.threshold_backward.default(g, x, 0.0),
            aten.gelu_backward.default(g, x),
            aten.addcmul.default(x, g, g, value=0.5),
            aten.nan_to_num.default(aten.log.default(x)),
        )

    check(fn, x, g, atol=1e-5, rtol=1e-4)
