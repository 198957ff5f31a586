"""Pooling lowerings against eager: max/avg/adaptive-avg pooling and their gradients,
over window shapes (padding, ceil mode, dilation, ragged and big windows), layouts and
dtypes; none of them may fall back to ATen."""

import contextlib
import random

import pytest
import torch
from loopir_testing import check, suite_backend

from kiln.capture import counters
from kiln.loopir.ir.loops import Reduction

aten = torch.ops.aten

HALF = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


@contextlib.contextmanager
def no_fallbacks():
    counters.clear()
    yield
    assert "fallback_ops" not in counters.snapshot(), counters.snapshot()


def _image(shape, layout="contiguous", dtype=torch.float32):
    if layout == "channels_last":
        return torch.randn(shape).to(dtype).contiguous(memory_format=torch.channels_last)
    if layout == "transposed":  # H and W swapped in memory
        n, c, h, w = shape
        return torch.randn(n, c, w, h).to(dtype).transpose(2, 3)
    return torch.randn(shape).to(dtype)


def _tol(dtype):
    tol = HALF.get(dtype, 1e-5)
    return {"atol": tol, "rtol": tol}


# (kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    ([3, 3], [2, 2], [1, 1], [1, 1], False),  # resnet's stem
    ([2, 2], [2, 2], [0, 0], [1, 1], False),
    ([3, 2], [1, 2], [1, 0], [1, 1], True),
    ([3, 3], [2, 2], [1, 1], [2, 2], False),  # dilated
    ([3, 3], [], [0], [1], True),  # stride defaults to the kernel
]


@pytest.mark.parametrize("case", range(len(MAX_CASES)))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_max_pool2d_and_backward(case, layout):
    kernel, stride, padding, dilation, ceil = MAX_CASES[case]
    x = _image((2, 3, 9, 11), layout)

    def fn(x, g):
        out, idx = aten.max_pool2d_with_indices.default(x, kernel, stride, padding, dilation, ceil)
        grad = aten.max_pool2d_with_indices_backward.default(
            g, x, kernel, stride, padding, dilation, ceil, idx
        )
        return aten.relu.default(out), idx, grad

    out_shape = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil)
    g = torch.randn(out_shape[0].shape)
    with no_fallbacks():
        check(fn, x, g, **_tol(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_max_pool2d_half_and_3d(dtype):
    x = torch.randn(4, 10, 10).to(dtype)  # (C, H, W): no batch dim
    g = torch.randn(4, 5, 5).to(dtype)

    def fn(x, g):
        out, idx = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])
        grad = aten.max_pool2d_with_indices_backward.default(
            g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx
        )
        return out, idx, grad

    with no_fallbacks():
        check(fn, x, g, **_tol(dtype))


def test_max_pool2d_nan_ties_and_minus_inf():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, :3, :3] = float("-inf")  # a window of -inf: its first in-range position
    x[0, 0, 4:, 4:] = 1.0  # ties: the first maximum

    def fn(x):
        return aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])

    with no_fallbacks():
        check(fn, x)


def test_max_pool2d_big_window_uses_the_decomposition():
    x = torch.randn(2, 3, 12, 12)
    g = torch.randn(2, 3, 2, 2)

    def fn(x, g):
        out, idx = aten.max_pool2d_with_indices.default(x, [6, 6], [6, 6])
        grad = aten.max_pool2d_with_indices_backward.default(
            g, x, [6, 6], [6, 6], [0, 0], [1, 1], False, idx
        )
        return out, idx, grad

    with no_fallbacks():
        check(fn, x, g)


# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CASES = [
    ([2, 2], [2, 2], [0, 0], False, True, None),  # densenet's transitions
    ([3, 3], [1, 1], [1, 1], False, True, None),
    ([3, 3], [1, 1], [1, 1], False, False, None),
    ([3, 2], [2, 2], [1, 1], True, False, None),
    ([3, 3], [2, 2], [1, 0], True, True, None),
    ([2, 3], [2, 1], [0, 1], False, True, 5),
    ([7, 7], [7, 7], [0, 0], False, True, None),  # 49 positions: a Reduction
    ([6, 5], [2, 3], [2, 1], True, False, None),  # big, padded and ragged
]


@pytest.mark.parametrize("case", range(len(AVG_CASES)))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_avg_pool2d_and_backward(case, layout):
    kernel, stride, padding, ceil, include_pad, divisor = AVG_CASES[case]
    x = _image((2, 3, 14, 15), layout)
    args = (kernel, stride, padding, ceil, include_pad, divisor)
    g = torch.randn(aten.avg_pool2d.default(x, *args).shape)

    def fn(x, g):
        out = aten.avg_pool2d.default(x, *args)
        return aten.mul.Tensor(out, 2.0), aten.avg_pool2d_backward.default(g, x, *args)

    with no_fallbacks():
        check(fn, x, g, **_tol(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_avg_pool2d_half(dtype):
    x = torch.randn(2, 3, 8, 8).to(dtype)
    g = torch.randn(2, 3, 4, 4).to(dtype)

    def fn(x, g):
        args = ([3, 3], [2, 2], [1, 1], False, False, None)
        return aten.avg_pool2d.default(x, *args), aten.avg_pool2d_backward.default(g, x, *args)

    with no_fallbacks():
        check(fn, x, g, **_tol(dtype))


@pytest.mark.parametrize(
    ("size", "out"),
    [((7, 7), (1, 1)), ((10, 12), (5, 3)), ((7, 9), (3, 4)), ((5, 5), (7, 7)), ((13, 3), (4, 2))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adaptive_avg_pool2d_and_backward(size, out, dtype):
    x = _image((2, 3, *size), "transposed" if size[0] == size[1] else "contiguous", dtype)
    g = torch.randn(2, 3, *out).to(dtype)

    def fn(x, g):
        pooled = aten._adaptive_avg_pool2d.default(x, out)
        return pooled, aten._adaptive_avg_pool2d_backward.default(g, x)

    with no_fallbacks():
        check(fn, x, g, **_tol(dtype))


def test_global_average_pool_is_one_reduction():
    x = torch.randn(2, 8, 7, 7)

    def fn(x):
        return (aten.relu.default(aten._adaptive_avg_pool2d.default(x, [1, 1])),)

    with no_fallbacks():
        compiled = check(fn, x, **_tol(torch.float32))
    nodes = [n for s in compiled.steps for n in getattr(s, "group", None).nodes]
    assert sum(isinstance(n.buffer.data, Reduction) for n in nodes) == 1


def test_pooled_values_read_by_many_consumers_are_stored_once():
    """A max pool feeding several concatenations (DenseNet's stem) is computed once,
    not re-run window by window inside every consumer."""
    x = torch.randn(2, 4, 9, 9)

    def fn(x):
        pooled = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[0]
        return tuple(aten.mul.Tensor(pooled, float(k)) for k in range(1, 5))

    compiled = check(fn, x)
    names = {n.buffer.name for s in compiled.steps for n in getattr(s, "group", None).nodes}
    window_loads = [
        n for s in compiled.steps for n in s.group.nodes if "max_pool" in n.buffer.data.origin
    ]
    assert len(window_loads) == 1 and len(names) == 5


def test_a_costly_gradient_read_at_each_window_tap_is_stored_once():
    """Max-pool backward reads its gradient at up to four output positions per input:
    a producer with many ops (DenseNet's dense-block gradients and their batch-norm
    backward) is stored first instead of being recomputed at every tap."""
    x = torch.randn(2, 3, 9, 9)
    idx = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])[1]
    g = torch.randn(idx.shape)

    def pool_backward(grad, x, idx):
        args = [[3, 3], [2, 2], [1, 1], [1, 1], False, idx]
        return (aten.max_pool2d_with_indices_backward.default(grad, x, *args),)

    def plain(x, g, idx):
        return pool_backward(g, x, idx)

    def costly(x, g, idx):
        grad = aten.mul.Tensor(aten.add.Tensor(aten.tanh.default(g), aten.sin.default(g)), g)
        grad = aten.sub.Tensor(aten.mul.Tensor(grad, aten.cos.default(g)), aten.exp.default(g))
        return pool_backward(grad, x, idx)

    for fn, kernels in [(plain, 1), (costly, 2)]:
        with no_fallbacks():
            compiled = check(fn, x, g, idx, **_tol(torch.float32))
        nodes = [n for s in compiled.steps for n in getattr(s, "group", None).nodes]
        assert len(nodes) == kernels, [n.buffer.data.origin for n in nodes]


def _depthwise_extern_calls():
    """The convolution library calls a depthwise convolution makes on the suite's backend:
    none where it is a loop of the graph; one where the backend leaves it to the library
    (the C++ backend, in the lowering corpus), whose values the test still checks."""
    return None if suite_backend().traits.lowered_depthwise else {"aten.convolution.default": 1}


# (channels, multiplier, kernel, stride, padding, dilation, bias)
DEPTHWISE_CASES = [
    (8, 1, [3, 3], [1, 1], [1, 1], [1, 1], True),  # MobileNet's blocks
    (8, 1, [3, 3], [2, 2], [1, 1], [1, 1], False),
    (6, 1, [5, 5], [2, 2], [2, 2], [1, 1], True),  # EfficientNet's 5x5, strided
    (4, 2, [3, 3], [1, 1], [2, 2], [2, 2], True),  # two output channels per input, dilated
    (5, 1, [3, 1], [1, 2], [0, 1], [1, 1], False),  # a ragged window, no padding in h
]


@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_depthwise_convolution_is_one_fused_kernel(case, layout):
    """A depthwise convolution is a loop of the graph, not a library call: the window's
    taps times the channel's weights, fused with the batch norm and activation after it."""
    c, mult, kernel, stride, padding, dilation, bias = DEPTHWISE_CASES[case]
    x = _image((2, c, 9, 11), layout)
    w, b, scale = torch.randn(c * mult, 1, *kernel), torch.randn(c * mult), torch.randn(c * mult)

    def fn(x, w, b, scale):
        y = aten.convolution.default(
            x, w, b if bias else None, stride, padding, dilation, False, [0, 0], c
        )
        y = aten.mul.Tensor(y, aten.view.default(scale, [-1, 1, 1]))
        return (aten.silu.default(y),)

    counters.clear()
    with no_fallbacks():
        compiled = check(fn, x, w, b, scale, **_tol(torch.float32))
    assert counters.snapshot().get("extern_kernels") == _depthwise_extern_calls()
    if _depthwise_extern_calls() is None:
        assert len(compiled.steps) == 1


@pytest.mark.parametrize("seed", range(8))
def test_depthwise_convolution_random_shapes(seed):
    """Random windows, strides, paddings, dilations, multipliers and image sizes (down to
    outputs of one position, and an empty batch), against ATen's convolution."""
    rng = random.Random(seed)
    c, mult = rng.randint(2, 6), rng.choice([1, 1, 2, 3])
    kernel = [rng.randint(1, 5), rng.randint(1, 5)]  # at most 25 taps: all unrolled
    stride, dilation = [rng.randint(1, 3) for _ in range(2)], [rng.randint(1, 2) for _ in range(2)]
    padding = [rng.randint(0, k // 2 + 1) for k in kernel]
    size = [
        max(d * (k - 1) + 1 - 2 * p, 1) + rng.randint(0, 6)
        for k, p, d in zip(kernel, padding, dilation)
    ]
    batch = 0 if seed == 7 else rng.randint(1, 3)
    x = _image((batch, c, *size), rng.choice(["contiguous", "channels_last", "transposed"]))
    w, b = torch.randn(c * mult, 1, *kernel), torch.randn(c * mult)

    def fn(x, w, b):
        args = (stride, padding, dilation, False, [0, 0], c)
        return (aten.convolution.default(x, w, b, *args),)

    counters.clear()
    with no_fallbacks():
        check(fn, x, w, b, **_tol(torch.float32))
    assert counters.snapshot().get("extern_kernels") == _depthwise_extern_calls()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_depthwise_convolution_half_sums_in_float32(dtype):
    x = _image((2, 4, 8, 8), "channels_last", dtype)
    w = torch.randn(4, 1, 3, 3).to(dtype)

    def fn(x, w):
        return (aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4),)

    with no_fallbacks():
        check(fn, x, w, **_tol(dtype))
    assert counters.snapshot().get("extern_kernels") == _depthwise_extern_calls()


@pytest.mark.parametrize(
    "shape, weight, groups, transposed",
    [
        ((2, 4, 9, 9), (4, 2, 3, 3), 2, False),  # grouped: two input channels an output
        ((2, 4, 9, 9), (4, 1, 7, 7), 4, False),  # ConvNeXt's 7x7: too big to unroll
        ((2, 4, 9, 9), (4, 1, 3, 3), 4, True),  # transposed
        ((2, 4, 9, 9), (8, 4, 1, 1), 1, False),  # dense
    ],
)
def test_other_convolutions_stay_library_calls(shape, weight, groups, transposed):
    x, w = torch.randn(shape), torch.randn(weight)
    if transposed:
        w = torch.randn(weight[1] * groups, weight[0] // groups, *weight[2:])

    def fn(x, w):
        out = aten.convolution.default(
            x, w, None, [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups
        )
        return (out,)

    counters.clear()
    check(fn, x, w, **_tol(torch.float32))
    assert counters.snapshot().get("extern_kernels") == {"aten.convolution.default": 1}
