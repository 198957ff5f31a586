"""View, cat, pad and indexing lowerings against eager."""

import pytest
import torch
from loopir_testing import check

from kiln.loopir.ir.buffers import SliceBuffer
from kiln.loopir.scheduler.order import KernelStep

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_views(dtype, layout):
    base = torch.randn(4, 6, 5) * 5
    x = (
        base.to(dtype)
        if layout == "contiguous"
        else base.permute(2, 1, 0).contiguous().permute(2, 1, 0).to(dtype)
    )

    v = aten.view.default if layout == "contiguous" else aten.reshape.default
    uv = aten._unsafe_view.default if layout == "contiguous" else aten.reshape.default

    def fn(x):
        p = aten.permute.default(x, [2, 0, 1])
        return (
            v(x, [24, 5]),
            v(x, [4, -1]),
            uv(x, [2, 2, 30]),
            aten.reshape.default(p, [5, 24]),
            aten.mul.Tensor(p, 2) if dtype != torch.bool else p,
            aten.transpose.int(x, 0, 2),
            aten.unsqueeze.default(x, 1),
            aten.unsqueeze.default(x, -1),
            aten.squeeze.dim(aten.unsqueeze.default(x, 0), 0),
            aten.squeeze.default(aten.unsqueeze.default(x, 2)),
            aten.squeeze.dims(aten.unsqueeze.default(x, 3), [3, 0]),
            aten.slice.Tensor(x, 1, 1, 5, 2),
            aten.slice.Tensor(x, 2, -3, 100),
            aten.slice.Tensor(x, 0, 0, 9223372036854775807),
            aten.select.int(x, 1, -2),
            aten.select.int(x, 2, 0),
            aten.expand.default(aten.unsqueeze.default(x, 0), [3, 4, 6, 5]),
            aten.expand.default(aten.select.int(x, 0, 0), [2, -1, -1]),
            aten.flip.default(x, [0, 2]),
            aten.roll.default(x, [2, -1], [1, 2]),
            aten.roll.default(x, [3]),
            aten.alias.default(x),
            aten.t.default(aten.select.int(x, 2, 1)),
            aten.permute.default(aten.reshape.default(p, [5, 24]), [1, 0]),
        )

    check(fn, x)


def test_as_strided_of_input():
    def fn(x):
        return (aten.as_strided.default(x, [3, 2], [2, 5]), aten.as_strided.default(x, [4], [3], 1))

    check(fn, torch.randn(4, 6))


def test_cat_stack_pad_split():
    a, b = torch.randn(3, 4), torch.randn(3, 2)
    c = torch.randn(5, 4).t()  # non-contiguous, shape (4, 5)
    i = torch.randint(0, 9, (3, 4))

    def fn(a, b, c, i):
        return (
            aten.cat.default([a, b], 1),
            aten.cat.default([a, a, a], 0),
            aten.cat.default([a, i], 0),
            aten.cat.default([aten.t.default(a), c], 1),
            aten.stack.default([a, a], 0),
            aten.stack.default([a, a], 2),
            aten.constant_pad_nd.default(a, [1, 2]),
            aten.constant_pad_nd.default(a, [1, 0, 2, 1], 3.5),
            aten.constant_pad_nd.default(c, [-1, 1]),
            aten.constant_pad_nd.default(i, [2, 2], 7),
            aten.split.Tensor(c, 2, 1)[0],
            aten.split.Tensor(c, 2, 1)[2],
            aten.split_with_sizes.default(a, [1, 3], 1)[1],
            aten.unbind.int(b, 1)[1],
            aten.narrow.default(c, 1, 1, 3),
        )

    check(fn, a, b, c, i)


def test_cat_with_empty_and_zero_size():
    a, e = torch.randn(2, 3), torch.randn(0)
    z = torch.randn(0, 3)

    def fn(a, e, z):
        return (aten.cat.default([a, e], 0), aten.cat.default([z, a, z], 0))

    check(fn, a, e, z)


def test_rotary_cats_load_only_inside_their_pieces():
    """Partial rotary embeddings (transformers' Phi): ``rotate_half`` cats the negated second
    half of the rotated slice before the first, the angles are a cat of the frequencies with
    themselves, and a last cat passes the rest of the head through. A piece's load shifted
    back by its start reads before its input on the lanes of the pieces before it: every
    load is masked to its piece (the reference backend checks each load on the lanes no
    mask turns off)."""
    q = torch.randn(2, 4, 8, 16)  # batch, heads, sequence, head size; rotary size 8

    def fn(q, freqs):
        angles = aten.cat.default([freqs, freqs], -1)
        rot, rest = aten.slice.Tensor(q, 3, 0, 8), aten.slice.Tensor(q, 3, 8, 16)
        x1, x2 = aten.slice.Tensor(rot, 3, 0, 4), aten.slice.Tensor(rot, 3, 4, 8)
        rotated = aten.cat.default([aten.neg.default(x2), x1], -1)
        cos = aten.mul.Tensor(rot, aten.cos.default(angles))
        embedded = aten.add.Tensor(cos, aten.mul.Tensor(rotated, aten.sin.default(angles)))
        return aten.cat.default([embedded, rest], -1)

    check(fn, q, torch.randn(8, 4))


def test_cat_of_many_inputs_fills_windows_of_one_buffer():
    """More than eight pieces: each is stored into its window of the result, by the
    kernel that computes it, instead of one loop testing every piece's range."""
    xs = [torch.randn(4, 3 + k) for k in range(10)]
    i = torch.randint(0, 9, (4, 2))
    t = torch.randn(5, 4)

    def fn(i, t, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9):
        xs = [x0, x1, x2, x3, x4, x5, x6, x7, x8, x9]
        pieces = [aten.tanh.default(x) for x in xs[:8]]
        tt = aten.t.default(t)
        mm = aten.mm.default(tt, t)  # an extern result, copied into its window
        both = aten.cat.default([*pieces, i, tt, aten.slice.Tensor(mm, 0, 0, 4), x8, x9], 1)
        firsts = [aten.exp.default(aten.slice.Tensor(x, 1, 0, 3)) for x in xs]
        stacked = aten.stack.default(firsts, 1)
        return aten.mul.Tensor(both, 2), stacked, aten.add.Tensor(stacked, 1)

    compiled = check(fn, i, t, *xs)
    groups = [s.group for s in compiled.steps if isinstance(s, KernelStep)]
    targets = [
        [n.buffer.target for n in g.nodes if isinstance(n.buffer, SliceBuffer)] for g in groups
    ]
    assert sum(map(len, targets)) == 13 + 10
    # the stack's ten equal windows are filled by one kernel
    assert max(t.count(name) for t in targets for name in t) == 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_gather_index_scatter(dtype):
    x = (torch.randn(5, 6) * 4).to(dtype)
    idx = torch.randint(0, 6, (5, 3))
    rows = torch.randint(-5, 5, (4,))  # negative rows wrap
    cols = torch.randint(0, 6, (4,))
    src = (torch.randn(5, 3) * 4).to(dtype)
    uniq = torch.stack([torch.randperm(6)[:3] for _ in range(5)])

    def fn(x, idx, rows, cols, src, uniq):
        return (
            aten.gather.default(x, 1, idx),
            aten.gather.default(x, 0, aten.remainder.Scalar(idx, 5)),
            aten.index.Tensor(x, [rows]),
            aten.index.Tensor(x, [None, cols]),
            aten.index.Tensor(x, [rows, cols]),
            aten.index.Tensor(x, [aten.unsqueeze.default(rows, 1), cols]),
            aten.index_select.default(x, 1, cols),
            aten.index_put.default(
                x, [rows, cols], aten.mul.Scalar(aten.index.Tensor(x, [rows, cols]), 2), True
            ),
            aten.index_put.default(x, [aten.remainder.Scalar(rows, 5)], aten.select.int(x, 0, 0)),
            aten.scatter.src(x, 1, uniq, src),
            aten.scatter.value(x, 1, uniq, 2),
            aten.scatter_add.default(x, 1, idx, src),
            aten.embedding.default(x, aten.remainder.Scalar(idx, 5)),
        )

    atol = 5e-2 if dtype == torch.bfloat16 else None
    check(fn, x, idx, rows, cols, src, uniq, atol=atol, rtol=atol)


def test_index_non_adjacent_advanced_indices():
    x = torch.randn(3, 4, 5)
    i = torch.randint(0, 3, (2,))
    k = torch.randint(0, 5, (2,))

    def fn(x, i, k):
        return (aten.index.Tensor(x, [i, None, k]), aten.index.Tensor(x, [None, None, k]))

    check(fn, x, i, k)


def test_a_window_partition_feeds_a_matmul_as_a_view():
    """Swin's window partition: the (2, 8, 8, 7, 7, 96) clone read as (6272, 96) rows by the
    matmul is the clone's buffer itself (a copy per block before)."""

    def fn(x, w):
        y = aten.view.default(x, [2, 8, 7, 8, 7, 96])
        y = aten.clone.default(
            aten.permute.default(y, [0, 1, 3, 2, 4, 5]), memory_format=torch.contiguous_format
        )
        y = aten.view.default(aten.view.default(y, [-1, 49, 96]), [6272, 96])
        return (aten.mm.default(y, w),)

    c = check(fn, torch.randn(2, 56, 56, 96), torch.randn(96, 32), atol=1e-3, rtol=1e-3)
    assert c.kernel_count == 1
