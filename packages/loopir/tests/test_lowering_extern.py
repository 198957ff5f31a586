"""Extern kernels (ATen calls from the wrapper) with generated kernels around them."""

import torch
from loopir_testing import check

from kiln.loopir.pipeline import KernelStep

aten = torch.ops.aten


def test_matmuls_and_convolutions():
    a, b, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    ba, bb, base = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    go = torch.randn(1, 3, 6, 6)

    def fn(a, b, bias, ba, bb, base, img, k, go):
        conv_args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        grads = aten.convolution_backward.default(go, img, k, [3], *conv_args, [True, True, True])
        return (
            aten.mm.default(aten.mul.Scalar(a, 2.0), b),
            aten.addmm.default(bias, a, b, beta=0.5, alpha=2.0),
            aten.bmm.default(ba, bb),
            aten.baddbmm.default(base, ba, bb),
            aten.convolution.default(img, k, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1),
            grads[0],
            grads[1],
            grads[2],
        )

    check(fn, a, b, bias, ba, bb, base, img, k, go, atol=1e-4, rtol=1e-4)


def test_pooling_sorting_and_friends():
    img = torch.randn(2, 3, 8, 8)
    x = torch.randn(4, 7)
    w, bias = torch.randn(3), torch.randn(3)

    def fn(img, x, w, bias):
        pooled = aten.max_pool2d_with_indices.default(img, [2, 2], [2, 2])
        gn = aten.native_group_norm.default(img, w, bias, 2, 3, 64, 3, 1e-5)
        srt = aten.sort.default(x, 1, True)
        stable = aten.sort.stable(x, stable=True, dim=0)
        top = aten.topk.default(x, 3)
        return (
            aten.relu.default(pooled[0]),
            pooled[1],
            aten.max_pool2d_with_indices_backward.default(
                aten.ones_like.default(pooled[0]),
                img,
                [2, 2],
                [2, 2],
                [0, 0],
                [1, 1],
                False,
                pooled[1],
            ),
            aten.avg_pool2d.default(img, [2, 2]),
            aten.avg_pool2d_backward.default(
                aten.ones_like.default(aten.avg_pool2d.default(img, [2, 2])),
                img,
                [2, 2],
                [2, 2],
                [0, 0],
                False,
                True,
                None,
            ),
            aten._adaptive_avg_pool2d.default(img, [1, 1]),
            aten._adaptive_avg_pool2d_backward.default(
                aten._adaptive_avg_pool2d.default(img, [1, 1]), img
            ),
            aten.upsample_nearest2d.default(img, [16, 16]),
            aten.upsample_nearest2d.vec(img, None, [2.0, 2.0]),
            aten.upsample_bilinear2d.default(img, [12, 12], False),
            aten.upsample_bilinear2d.vec(img, [4, 4], True, None),
            gn[0],
            gn[1],
            srt[0],
            srt[1],
            stable[0],
            top[0],
            aten.add.Tensor(top[1], 1),
            aten._cdist_forward.default(x, x, 2.0, None),
        )

    c = check(fn, img, x, w, bias, atol=1e-4, rtol=1e-4)
    kernels = [s for s in c.steps if isinstance(s, KernelStep)]
    assert kernels  # relu / ones_like / add epilogues are generated kernels


def test_attention_extern():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))

    def fn(q, k, v):
        out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, scale=0.5)
        return (aten.mul.Scalar(out[0], 2.0),)

    check(fn, q, k, v, atol=1e-5, rtol=1e-5)


def test_legacy_convolution_extern():
    import pytest

    img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)

    def fn(img, k):
        args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1, False, False, False, True)
        return (aten.relu.default(aten._convolution.default(img, k, None, *args)),)

    try:
        check(fn, img, k, atol=1e-5, rtol=1e-5)
    except NotImplementedError:
        pytest.skip("this torch has no meta kernel for _convolution")


def test_extern_output_strides_differ_from_traced_ones():
    """The CPU attention kernel's output strides follow its inputs', which loopir lays
    out afresh: the wrapper must give the result the planned strides (MHA regression)."""
    x = torch.randn(5, 2, 3, 16)

    def fn(x):
        qkv = aten.permute.default(aten.mul.Tensor(x, 0.5), [2, 1, 0, 3])
        heads = [aten.view.default(aten.select.int(qkv, 0, i), [2, 5, 4, 4]) for i in range(3)]
        q, k, v = (aten.permute.default(h, [0, 2, 1, 3]) for h in heads)
        out = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, is_causal=True)
        merged = aten.clone.default(aten.permute.default(out[0], [2, 0, 1, 3]))
        return aten.add.Tensor(aten.view.default(merged, [10, 16]), 1.0), out[1]

    check(fn, x, atol=1e-5, rtol=1e-5)
