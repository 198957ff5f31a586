"""Reduction lowerings against eager: dims, keepdim, layouts and dtypes, batched per case."""

import pytest
import torch
from loopir_testing import aten_graph, check, to_meta

from kiln.loopir import BackendTraits, ReferenceBackend
from kiln.loopir.pipeline import compile_graph

aten = torch.ops.aten

DIMS = [[0], [1], [0, 1], [-1]]


def _pair(result):
    return result[0], result[1]


def _float_reductions(x):
    outs = []
    for dims in DIMS:
        for keep in (False, True):
            outs += [
                aten.sum.dim_IntList(x, dims, keep),
                aten.mean.dim(x, dims, keep),
                aten.amax.default(x, dims, keep),
                aten.amin.default(x, dims, keep),
                aten.var.correction(x, dims, correction=1, keepdim=keep),
                aten.std.correction(x, dims, correction=0, keepdim=keep),
                *_pair(aten.var_mean.correction(x, dims, correction=1, keepdim=keep)),
                aten.logsumexp.default(x, dims, keep),
            ]
    outs += [
        aten.sum.default(x),
        aten.mean.default(x),
        aten.prod.default(x),
        aten.prod.dim_int(x, 1),
        aten.max.default(x),
        aten.min.default(x),
        aten.argmax.default(x),
        aten.argmax.default(x, 1),
        aten.argmin.default(x, 0, True),
        *_pair(aten.max.dim(x, 1)),
        *_pair(aten.min.dim(x, 0, True)),
        aten.cumsum.default(x, 1),
        aten.cumsum.default(x, 0),
        aten.any.dim(aten.gt.Scalar(x, 1.0), 1),
        aten.all.dim(aten.gt.Scalar(x, -1.0), 0),
        aten.any.default(aten.gt.Scalar(x, 2.0)),
        aten.all.default(aten.gt.Scalar(x, -3.0)),
    ]
    return tuple(outs)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_float32_reductions(layout):
    base = {
        "contiguous": torch.randn(5, 7),
        "transposed": torch.randn(7, 5).t(),
        "sliced": torch.randn(5, 14)[:, ::2],
    }[layout]
    check(_float_reductions, base, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_reductions(dtype):
    x = torch.randn(6, 9, dtype=dtype)

    def fn(x):
        return (
            aten.sum.dim_IntList(x, [1]),
            aten.mean.dim(x, [0], True),
            aten.amax.default(x, [1]),
            aten.var.correction(x, [1], correction=1),
            aten.argmax.default(x, 1),
            aten.cumsum.default(x, 1),
            aten.sum.dim_IntList(x, [0], dtype=torch.float32),
        )

    check(fn, x, atol=5e-2, rtol=5e-2)


def test_integer_and_bool_reductions():
    x = torch.randint(-9, 9, (4, 6))
    b = torch.rand(4, 6) > 0.3

    def fn(x, b):
        return (
            aten.sum.dim_IntList(x, [1]),
            aten.sum.default(b),
            aten.prod.dim_int(x, 0),
            aten.amax.default(x, [0]),
            aten.amin.default(x, [1], True),
            aten.argmin.default(x, 1),
            aten.cumsum.default(x, 0),
            aten.cumsum.default(b, 1),
            aten.any.dim(b, 1),
            aten.all.dim(b, 0),
            aten.any.dims(x, [0, 1]),
            aten.mean.dim(aten._to_copy.default(x, dtype=torch.float32), [1]),
        )

    check(fn, x, b)


def test_zero_size_and_scalar_reductions():
    e = torch.randn(0, 4)
    s = torch.randn(())

    def fn(e, s):
        return (
            aten.sum.dim_IntList(e, [0]),
            aten.sum.dim_IntList(e, [1]),
            aten.prod.dim_int(e, 0),
            aten.any.dim(aten.gt.Scalar(e, 0), 0),
            aten.sum.default(s),
            aten.amax.default(s, []),
        )

    check(fn, e, s)


def test_reductions_over_zero_gathered_elements_are_constants():
    """Over zero elements a reduction has no loop: its body reads an index from a tensor of
    zero elements, which a loop-invariant load outside an empty loop would read anyway."""
    x = torch.randn(0, 4)
    idx = torch.zeros(0, dtype=torch.int64)

    def fn(x, idx):
        g = aten.index.Tensor(x, [idx])
        return (
            aten.sum.default(g),
            aten.sum.dim_IntList(g, [0]),
            aten.prod.default(g),
            aten.mean.default(g),
            *_pair(aten.var_mean.correction(g, [0], correction=1)),
            aten.any.default(aten.gt.Scalar(g, 0)),
            aten.all.default(aten.gt.Scalar(g, 0)),
            g,
        )

    compiled = check(fn, x, idx)
    groups = [s.group for s in compiled.steps if hasattr(s, "group")]
    reductions = [n for g in groups for n in g.nodes if n.mode != "x"]
    assert reductions == []


@pytest.mark.parametrize("dim", [0, -1])
def test_scalar_reductions_over_a_dim_stay_scalar_with_keepdim(dim):
    """A 0-d input reduced over dim 0 or -1 gives a 0-d result, keepdim or not (as eager)."""
    s = torch.randn(())

    def fn(s):
        b = aten.gt.Scalar(s, 0)
        outs = []
        for keep in (False, True):
            outs += [
                aten.sum.dim_IntList(s, [dim], keep),
                aten.prod.dim_int(s, dim, keep),
                aten.mean.dim(s, [dim], keep),
                aten.amax.default(s, [dim], keep),
                aten.amin.default(s, [dim], keep),
                aten.argmax.default(s, dim, keep),
                aten.argmin.default(s, dim, keep),
                aten.any.dim(b, dim, keep),
                aten.all.dim(b, dim, keep),
                aten.var.correction(s, [dim], correction=0, keepdim=keep),
                *_pair(aten.max.dim(s, dim, keep)),
                aten.logsumexp.default(s, [dim], keep),
            ]
        return tuple(outs)

    check(fn, s)


def test_broadcast_input_reduction():
    x = torch.randn(5, 1)

    def fn(x):
        y = aten.expand.default(x, [5, 6])
        return (aten.sum.dim_IntList(y, [0]), aten.mean.dim(y, [1]))

    check(fn, x)


class _SplittingBackend(ReferenceBackend):
    traits = BackendTraits(reduction_split_rows=32)  # as a GPU backend sets it


def test_a_backend_can_ask_for_long_reductions_in_two_steps():
    """Two channels of 8192 elements: each row is cut into 2 pieces (a piece holds at
    least 4096), the whole tensor into 4; then the pieces are folded."""
    x = torch.randn(2, 2, 64, 64) * 3 + 1

    def fn(x):
        var, mean = aten.var_mean.correction(x, [0, 2, 3], correction=1)
        return var, mean, aten.sum.dim_IntList(x, [0, 2, 3], True), aten.amax.default(x)

    gm = aten_graph(fn, x)
    compiled = compile_graph(gm, [to_meta(x)], backend=_SplittingBackend())
    torch.testing.assert_close(compiled(x), fn(x), atol=1e-4, rtol=1e-4)
    shapes = {(int(s.group.numel), int(s.group.rnumel)) for s in compiled.steps}
    assert {(4, 4096), (2, 2), (1, 4)} <= shapes, shapes
    assert all(r < 8192 for _, r in shapes), shapes


def test_an_outer_reduction_is_split_by_the_programs_it_runs():
    """Column sums of a (4096, 64) matrix (a bias gradient) read along the 64 results: a GPU
    folds 32 of them per program, so 2 programs would run; each column is cut into 16
    pieces instead. Row sums of a (64, 4096) matrix run 64 programs already: not cut."""
    x, y = torch.randn(4096, 64), torch.randn(64, 4096)

    def fn(x, y):
        return aten.sum.dim_IntList(x, [0]), aten.sum.dim_IntList(y, [1])

    gm = aten_graph(fn, x, y)
    compiled = compile_graph(gm, [to_meta(x), to_meta(y)], backend=_SplittingBackend())
    torch.testing.assert_close(compiled(x, y), fn(x, y), atol=1e-3, rtol=1e-4)
    shapes = sorted((int(s.group.numel), int(s.group.rnumel)) for s in compiled.steps)
    assert shapes == [(64, 16), (64, 4096), (1024, 256)], shapes


def test_an_outer_reduction_through_views_and_rolls_is_split_too():
    """The bias gradient of a linear layer on (batch, tokens, features) sums a 3-D gradient
    viewed 2-D, and Swin's LayerNorm gradients read rolled windows: the features still step
    by one, so both are cut as a plain (4096, 64) matrix is."""
    g, w = torch.randn(16, 256, 64), torch.randn(16, 16, 16, 64)

    def fn(g, w):
        rolled = aten.roll.default(w, [3, 3], [1, 2])
        return (
            aten.sum.dim_IntList(aten.view.default(g, [4096, 64]), [0]),
            aten.sum.dim_IntList(aten.view.default(rolled, [4096, 64]), [0]),
        )

    gm = aten_graph(fn, g, w)
    compiled = compile_graph(gm, [to_meta(g), to_meta(w)], backend=_SplittingBackend())
    torch.testing.assert_close(compiled(g, w), fn(g, w), atol=1e-3, rtol=1e-4)
    shapes = sorted((int(s.group.numel), int(s.group.rnumel)) for s in compiled.steps)
    assert shapes.count((1024, 256)) == 2 and (64, 4096) not in shapes, shapes
