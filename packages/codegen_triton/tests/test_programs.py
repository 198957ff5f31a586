"""ATen programs through loopir and the Triton backend, equal to eager.

Reductions of every kind (persistent and looped), softmax, layer norm, variance,
indexing (gather, embedding, index), cat and pad, scatter-add, 16-bit floats,
strided inputs and randomness (bit-equal to loopir's reference backend).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_testing import aten, aten_graph, check, kernel_sources, to_meta

from kiln.codegen_triton import TritonBackend, TritonOptions
from kiln.loopir import ReferenceBackend, compile_graph


@pytest.fixture(params=["persistent", "looped"])
def backend(request):
    limit = 1024 if request.param == "persistent" else 8
    return TritonBackend(TritonOptions(persistent_reduction_limit=limit))


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "op",
    [
        lambda x: aten.sum.dim_IntList(x, [1]),
        lambda x: aten.prod.dim_int(x, 1),
        lambda x: aten.amax.default(x, [1]),
        lambda x: aten.amin.default(x, [0]),
        lambda x: aten.argmax.default(x, 1),
        lambda x: aten.argmin.default(x, 0),
        lambda x: aten.any.dim(aten.gt.Scalar(x, 1.5), 1),
        lambda x: aten.mean.dim(x, [0, 1]),
        lambda x: aten.var.correction(x, [1], correction=1),
    ],
    ids=["sum", "prod", "amax", "amin_outer", "argmax", "argmin_outer", "any", "mean_all", "var"],
)
def test_reductions(op, backend):
    x = _r(7, 19) * 0.9
    x[2, 3] = x[2, 11]  # a tie for argmax/argmin
    check(lambda t: (op(t),), x, backend=backend, atol=1e-5, rtol=1e-5)


def test_max_propagates_nan(backend):
    x = _r(4, 20)
    x[1, 5] = float("nan")
    check(lambda t: (aten.amax.default(t, [1]), aten.argmax.default(t, 1)), x, backend=backend)


def test_int_sum_and_xor(backend):
    x = torch.randint(-50, 50, (5, 13))
    check(lambda t: (aten.sum.dim_IntList(t, [1]),), x, backend=backend)


def test_softmax_log_softmax_layer_norm(backend):
    x, w, b = _r(6, 30), _r(30), _r(30)

    def fn(x, w, b):
        return (
            aten._softmax.default(x, -1, False),
            aten._log_softmax.default(x, 1, False),
            aten.native_layer_norm.default(x, [30], w, b, 1e-5)[0],
        )

    check(fn, x, w, b, backend=backend, atol=1e-5, rtol=1e-4)


def test_bf16_softmax_computes_in_float32(backend):
    x = _r(4, 24, dtype=torch.bfloat16)
    check(lambda t: (aten._softmax.default(t, -1, False),), x, backend=backend)


def test_transposed_and_broadcast_inputs():
    a, b, c = _r(9, 17), _r(17, 9), _r(17)
    fn = lambda a, b, c: (aten.add.Tensor(aten.mul.Tensor(a, aten.t.default(b)), c),)  # noqa: E731
    check(fn, a, b, c)


def test_indexing_gather_embedding_index():
    table, idx = _r(20, 6), torch.randint(-20, 20, (11,))
    src, gidx = _r(5, 7), torch.randint(0, 7, (5, 3))

    def fn(table, idx, src, gidx):
        return (
            aten.embedding.default(table, aten.remainder.Scalar(idx, 20)),
            aten.index.Tensor(table, [idx]),
            aten.gather.default(src, 1, gidx),
            aten.index_select.default(src, 0, aten.remainder.Scalar(idx, 5)),
        )

    check(fn, table, idx, src, gidx)


def test_cat_and_pad():
    a, b = _r(4, 5), _r(4, 3)

    def fn(a, b):
        return (aten.cat.default([a, b], 1), aten.constant_pad_nd.default(a, [2, 1, 0, 3], -1.5))

    check(fn, a, b)


def test_scatter_add_accumulates():
    target, idx, src = _r(10), torch.randint(0, 10, (40,)), _r(40)

    def fn(t, i, s):
        return (aten.index_put.default(t, [i], s, True),)

    check(fn, target, idx, src, atol=1e-5, rtol=1e-5)


def test_random_matches_the_reference_bits():
    x = torch.rand(33, 20)

    def fn(x):
        return (
            aten.rand_like.default(x),
            aten.randn_like.default(x),
            aten.native_dropout.default(x, 0.5, True)[0],
        )

    gm = aten_graph(fn, x)
    metas = [to_meta(x)]
    ours = compile_graph(gm, metas, backend=TritonBackend())
    ref = compile_graph(aten_graph(fn, x), metas, backend=ReferenceBackend())
    torch.manual_seed(3)
    got = ours(x)
    torch.manual_seed(3)
    want = ref(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_where_clamp_pow_chain():
    x, y = _r(8, 9), _r(8, 9)

    def fn(x, y):
        z = aten.where.self(
            aten.gt.Tensor(x, y), aten.clamp.default(x, -0.5, 0.5), aten.pow.Tensor_Scalar(y, 2)
        )
        return (aten.tanh.default(z), aten.sigmoid.default(z))

    check(fn, x, y)


def test_reduction_then_pointwise_in_one_kernel(backend):
    x = _r(6, 33)
    c = check(
        lambda t: (aten.sub.Tensor(t, aten.mean.dim(t, [1], True)),),
        x,
        backend=backend,
        atol=1e-5,
        rtol=1e-5,
    )
    assert c.kernel_count == 1
    src = kernel_sources(c)[0]
    assert ("for roffset" in src) == (backend.options.persistent_reduction_limit < 33)


def test_cat_with_empty_pieces_never_reads_outside_a_buffer():
    a, z = _r(2, 3), _r(0, 3)
    c = check(lambda a, z: (aten.cat.default([z, a, z], 0),), a, z)
    assert kernel_sources(c)[0].count("tl.load(") == 1  # the empty pieces are never loaded


def test_pool_window_across_channels():
    """A pooling window read through several size digits (resnet's stem: 112x112 -> 56x56,
    rows of several channels folded into one index digit)."""
    x, scale = _r(2, 4, 112, 112), _r(1, 4, 1, 1)

    def fn(x, scale):
        y = aten.relu.default(aten.mul.Tensor(x, scale))
        return (aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0],)

    check(fn, x, scale, backend=TritonBackend())


def test_depthwise_convolution_batch_norm_and_silu_are_one_kernel():
    """EfficientNet's depthwise block: cuDNN compiles NHWC depthwise kernels at run time on
    a process's first call; here the window sum, the normalisation and the activation are
    one kernel of the graph."""
    x = _r(2, 8, 7, 9).contiguous(memory_format=torch.channels_last)
    w, mean, scale, shift = _r(8, 1, 5, 5), _r(8), _r(8), _r(8)

    def fn(x, w, mean, scale, shift):
        y = aten.convolution.default(x, w, None, [2, 2], [2, 2], [1, 1], False, [0, 0], 8)
        col = lambda t: aten.view.default(t, [-1, 1, 1])  # noqa: E731
        y = aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(y, col(mean)), col(scale)), col(shift))
        return (aten.silu.default(y),)

    compiled = check(fn, x, w, mean, scale, shift, atol=1e-5, rtol=1e-5)
    assert len(kernel_sources(compiled)) == len(compiled.steps) == 1


def _channel_statistics(x):
    """BatchNorm's per-channel statistics and its backward's sums, and whole-tensor ones."""
    var, mean = aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)
    # in float32: eager rounds each 16-bit factor, and 12288 roundings multiply up
    small = aten.mul.Tensor(aten._to_copy.default(x, dtype=torch.float32), 1e-3)
    return (
        var,
        mean,
        aten.var.correction(x, [0, 2, 3], correction=1),
        aten.sum.dim_IntList(aten.mul.Tensor(x, mean), [0, 2, 3]),
        aten.amax.default(x, [0, 2, 3]),
        aten.amin.default(x, [0, 2, 3], True),
        aten.prod.dim_int(aten.reshape.default(aten.exp.default(small), [4, -1]), 1),
        aten.any.dim(aten.reshape.default(aten.gt.Scalar(x, 4.3), [4, -1]), 1),
        aten.mean.default(x),
    )


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_reductions_with_few_rows_run_in_two_steps(layout, dtype):
    """3 channels of 16384 elements: each row is cut in 4 pieces (12 programs rather than
    3), then the partial results are folded; the values are eager's. Channels-last, the
    reads run along the channels, which one program folds together: 8 pieces."""
    backend = TritonBackend()
    backend.traits = dataclasses.replace(backend.traits, reduction_split_rows=64)
    x = (_r(4, 3, 64, 64) * 2 + 1).to(dtype).contiguous(memory_format=layout)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    compiled = check(_channel_statistics, x, backend=backend, **tol)
    shapes = {
        (int(s.group.numel), int(s.group.rnumel)) for s in compiled.steps if s.group.rnumel != 1
    }
    pieces = 8 if layout == torch.channels_last else 4
    assert (3 * pieces, 16384 // pieces) in shapes  # 3 channels x the pieces
    assert (3, pieces) in shapes  # the pieces folded
    assert all(r < 16384 for _, r in shapes), shapes  # no row folded whole


def test_per_channel_statistics_of_an_nhwc_tensor_loop_over_short_wide_tiles():
    """Channels are contiguous and rows are not: the kernel reads blocks of neighbouring
    channels in a loop rather than one channel's 2048 elements at once."""
    x = _r(8, 32, 16, 16).contiguous(memory_format=torch.channels_last)
    backend = TritonBackend()
    # in one step (a GPU would cut each channel in 8)
    backend.traits = dataclasses.replace(backend.traits, reduction_split_rows=0)

    def fn(x):
        return aten.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)

    compiled = check(fn, x, atol=1e-4, rtol=1e-4, backend=backend)
    (source,) = (s.code.fn.ks for s in compiled.steps)
    assert source.outer and not source.persistent
    nchw = check(fn, x.contiguous(), atol=1e-4, rtol=1e-4, backend=backend)
    (source,) = (s.code.fn.ks for s in nchw.steps)
    assert not source.outer and source.persistent
