"""Window lowerings: max/avg/adaptive-avg pooling over the last two dims, their gradients, and
depthwise convolutions (a window sum weighted per channel, :func:`depthwise_convolution`).

Each output element folds a small window of input elements (or, for a gradient, of
the output elements whose windows cover it). As in Inductor, windows of up to
``UNROLL`` positions are unrolled into one ``Pointwise`` (fused with its producer and
consumers: batch norm → relu → max pool is one kernel); bigger ones become a
``Reduction`` over the window offsets. Out-of-range positions (padding, ceil mode,
ragged adaptive windows) are ``ops.masked`` loads. ``max_pool2d`` with dilation in
its backward, or windows too big to unroll with indices, decline: their
``torch._decomp`` decomposition runs instead (``graph.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import Unlowerable
from kiln.loopir.ir.loops import Pointwise, Reduction
from kiln.loopir.ir.views import StorageBox, TensorBox
from kiln.loopir.lowering.common import compute_dtype, origin, out_meta
from kiln.loopir.lowering.registry import LOWERINGS, overloads, register_lowering
from kiln.loopir.virtualized import ops

__all__ = ["UNROLL", "depthwise_convolution"]

S = sympy.Integer
Index = Sequence[sympy.Expr]
Term = Callable[[Index, Index], Any]

UNROLL = 25
"""Window positions unrolled into one pointwise expression (Inductor's limit)."""


@dataclasses.dataclass(frozen=True)
class _Dim:
    """One pooled dimension: input size ``n``, output size ``out``, kernel ``k``, stride
    ``s``, padding ``p`` and dilation ``d``. Position of offset ``j`` in window ``o``:
    ``o*s - p + j*d``."""

    n: int | sympy.Expr
    out: int | sympy.Expr
    k: int
    s: int
    p: int
    d: int = 1

    def at(self, o: sympy.Expr, j: sympy.Expr) -> sympy.Expr:
        return o * self.s - self.p + j * self.d

    def extent(self, j: sympy.Expr | None = None) -> tuple[int, Any]:
        """Lowest and highest position offset ``j`` reaches (any offset: None or a symbol)."""
        lo_j, hi_j = (int(j), int(j)) if j is not None and j.is_Integer else (0, self.k - 1)
        return lo_j * self.d - self.p, (self.out - 1) * self.s - self.p + hi_j * self.d

    @property
    def index_dtype(self) -> torch.dtype:
        """int32 for positions of static sizes (as eager's, they fit): vector code computes
        the masks and divisors of every window in it, where int64 lanes halve the width and
        convert to float lane by lane without AVX-512; int64 for symbolic sizes."""
        if _is_symbolic(self.n) or _is_symbolic(self.out):
            return torch.int64
        low, high = self.extent()
        return (
            torch.int32 if max(abs(low), abs(high), int(self.n)) + self.k < 2**30 else torch.int64
        )

    def inside(self, o: sympy.Expr, j: sympy.Expr, lo: int, hi: Any) -> Any:
        """``lo <= position < hi`` as an ops value; None when always true."""
        low, high = self.extent(j)
        below = _below(high, hi)
        if low >= lo and below:
            return None
        dtype = self.index_dtype
        pos = ops.index_expr(self.at(o, j), dtype)
        conds = []
        if low < lo:
            conds.append(ops.ge(pos, ops.constant(lo, dtype)))
        if not below:
            conds.append(ops.lt(pos, _int64(hi) if _is_symbolic(hi) else ops.constant(hi, dtype)))
        return _all(conds)


def _int64(value: Any) -> Any:
    """An int, or a symbolic size (this call's value), as an int64 value."""
    if _is_symbolic(value):
        return ops.index_expr(value, torch.int64)
    return ops.constant(value, torch.int64)


def _is_symbolic(value: Any) -> bool:
    return isinstance(value, sympy.Basic) and symbolic.is_symbolic(value)


def _below(a: Any, b: Any) -> bool:
    """``a < b``, for every admitted size where either is symbolic (else not known: False)."""
    if _is_symbolic(a) or _is_symbolic(b):
        return symbolic.provably(sympy.Gt(b - a, 0))
    return bool(a < b)


def _all(conds: Sequence[Any]) -> Any:
    found = [c for c in conds if c is not None]
    if not found:
        return None
    out = found[0]
    for c in found[1:]:
        out = ops.logical_and(out, c)
    return out


def _masked(mask: Any, body: Callable[[], Any], other: float) -> Any:
    return body() if mask is None else ops.masked(mask, body, other)


def _ints(v: Sequence[int] | int, n: int = 2) -> list[int]:
    vals = [v] if isinstance(v, int) else list(v)
    return vals * n if len(vals) == 1 else vals


def _dims(
    x_size: Sequence[sympy.Expr], out_size: Sequence[Any], kernel: Any, stride: Any, padding: Any,
    dilation: Any = 1,
) -> tuple[_Dim, _Dim]:  # fmt: skip
    k = _ints(kernel)
    s = _ints(stride) if stride else k
    p, d = _ints(padding), _ints(dilation)
    n = [_size(e) for e in x_size[-2:]]
    o = [_size(e) for e in out_size[-2:]]
    h, w = (_Dim(n[i], o[i], k[i], s[i], p[i], d[i]) for i in range(2))
    return h, w


def _size(value: Any) -> int | sympy.Expr:
    """A pooled size: an int, or a symbolic size (read without a guard)."""
    expr = sizes.sympify(value)
    return expr if symbolic.is_symbolic(expr) else sizes.evaluate_int(expr)


def _fold(
    x: TensorBox, size: Sequence[sympy.Expr], window: Sequence[int], kind: str, term: Term
) -> Callable[[Index], Any]:
    """A loader of ``kind`` (sum or max) of ``term(index, offsets)`` over the window."""
    math_dtype = compute_dtype(x.get_dtype())
    if math.prod(window) <= UNROLL:
        combine = ops.add if kind == "sum" else ops.maximum

        def load(index: Index) -> Any:
            acc = None
            for offsets in itertools.product(*(range(n) for n in window)):
                value = term(index, [S(j) for j in offsets])
                acc = value if acc is None else combine(acc, value)
            return acc

        return load
    red = Reduction(
        x.get_device(), math_dtype, tuple(size), origin(), tuple(S(n) for n in window), kind,
        math_dtype, term,
    )  # fmt: skip
    box = StorageBox(red)
    box.realize()
    return box.make_loader()


def _tap(load: Callable[[Index], Any], h: _Dim, w: _Dim, index: Index, offsets: Index) -> Any:
    """The input at ``offsets`` of the window at ``index`` (its last two dims), 0 in padding."""
    (*lead, oh, ow), (jh, jw) = index, offsets
    mask = _all([h.inside(oh, jh, 0, h.n), w.inside(ow, jw, 0, w.n)])
    return _masked(mask, lambda: load([*lead, h.at(oh, jh), w.at(ow, jw)]), 0.0)


def _pointwise(x: TensorBox, dtype: torch.dtype, size: Sequence[Any], fn: Any) -> TensorBox:
    ranges = tuple(sizes.sympify(n) for n in size)
    return TensorBox.from_loops(Pointwise(x.get_device(), dtype, ranges, origin(), fn))


def _loader(x: TensorBox) -> Callable[[Index], Any]:
    """``x``'s values in its math dtype (float32 for half types)."""
    load, src = x.make_loader(), x.get_dtype()
    want = compute_dtype(src)
    return load if want == src else (lambda i: ops.to_dtype(load(i), want, src))


def _gathered(grad: TensorBox, fanout: int) -> Callable[[Index], Any]:
    """``_loader(grad)`` for a value (a gradient, a depthwise convolution's input) whose every
    element ``fanout`` output positions read.

    Each read inlines the value's producer again (the sum of a dense block's
    concatenated gradients and its batch-norm backward, in DenseNet's stem and
    transitions); when that would repeat too many ops, the value is stored once.
    A 2x2 average pool's backward reads each element at 4 positions, one per position.
    """
    box = grad.storage()
    if box is not None and box.repeats_too_much(fanout):
        box.realize()
    return _loader(grad)


def _lowest(dtype: torch.dtype) -> float:
    return float("-inf") if dtype.is_floating_point else float(torch.iinfo(dtype).min)


def _store(value: Any, dtype: torch.dtype) -> Any:
    math_dtype = compute_dtype(dtype)
    return value if math_dtype == dtype else ops.to_dtype(value, dtype, math_dtype)


# -- max pooling ----------------------------------------------------------------------
@register_lowering(*overloads("max_pool2d_with_indices", "default"))
def _max_pool2d_with_indices(
    x: TensorBox, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
    ceil_mode: bool = False,
) -> tuple[TensorBox, TensorBox]:  # fmt: skip
    out_size = out_meta()[0].shape
    h, w = _dims(x.get_size(), out_size, kernel_size, stride, padding, dilation)
    if h.k * w.k > UNROLL:
        raise Unlowerable("window too big to unroll: the decomposition computes indices")
    load, dtype = _loader(x), x.get_dtype()
    lowest = _lowest(dtype)
    offsets = list(itertools.product(range(h.k), range(w.k)))

    def window(index: Index) -> list[tuple[Any, Any, sympy.Expr]]:
        *lead, oh, ow = index
        found = []
        for jh, jw in offsets:
            ih, iw = h.at(oh, S(jh)), w.at(ow, S(jw))
            mask = _all([h.inside(oh, S(jh), 0, h.n), w.inside(ow, S(jw), 0, w.n)])
            value = _masked(mask, lambda i=[*lead, ih, iw]: load(i), lowest)  # type: ignore[misc]
            found.append((value, mask, ih * w.n + iw))
        return found

    def values(index: Index) -> Any:
        acc = None
        for value, _, _ in window(index):
            acc = value if acc is None else ops.maximum(acc, value)
        return _store(acc, dtype)

    def indices(index: Index) -> Any:
        # ATen's rule: the first in-range position, then any greater value or a NaN
        math_dtype = compute_dtype(dtype)
        best = ops.constant(lowest, math_dtype)
        where = ops.constant(-1, torch.int64)
        found = False  # statically sure some earlier position was in range
        for value, mask, pos in window(index):
            take = ops.logical_or(ops.gt(value, best), ops.isnan(value))
            if not found:
                take = ops.logical_or(take, ops.eq(where, ops.constant(-1, torch.int64)))
            take = _all([mask, take])
            where = ops.where(take, ops.index_expr(pos, torch.int64), where)
            best = ops.where(take, value, best)
            found = found or mask is None
        return where

    return (
        _pointwise(x, dtype, out_size, values),
        _pointwise(x, torch.int64, out_size, indices),
    )


def _covering(dim: _Dim, i: sympy.Expr, j: sympy.Expr) -> tuple[sympy.Expr, Any]:
    """Candidate ``j`` among the windows (dilation 1) that may cover position ``i``:
    window ``o = (i + p) // s - j``, and whether it really does."""
    o = sizes.FloorDiv(i + dim.p, dim.s) - j
    pos = ops.index_expr(o, torch.int64)
    conds = [
        ops.ge(pos, ops.constant(0, torch.int64)),
        ops.lt(pos, _int64(dim.out)),
        ops.lt(
            ops.index_expr(i + dim.p - o * dim.s, torch.int64), ops.constant(dim.k, torch.int64)
        ),
    ]
    return o, _all(conds)


@register_lowering(*overloads("max_pool2d_with_indices_backward", "default"))
def _max_pool2d_backward(
    grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
    ceil_mode: bool, indices: TensorBox,
) -> TensorBox:  # fmt: skip
    h, w = _dims(x.get_size(), grad.get_size(), kernel_size, stride, padding, dilation)
    if h.d != 1 or w.d != 1:
        raise Unlowerable("dilated max pooling backward: the decomposition scatters")
    window = (math.ceil(h.k / h.s), math.ceil(w.k / w.s))
    load_grad, load_index = _gathered(grad, h.k * w.k), indices.make_loader()

    def term(index: Index, offsets: Index) -> Any:
        *lead, ih, iw = index
        oh, mask_h = _covering(h, ih, offsets[0])
        ow, mask_w = _covering(w, iw, offsets[1])
        at = [*lead, oh, ow]
        here = ops.index_expr(ih * w.n + iw, torch.int64)

        def body() -> Any:
            hit = ops.eq(load_index(at), here)
            g = load_grad(at)
            return ops.where(hit, g, ops.constant(0.0, compute_dtype(grad.get_dtype())))

        return ops.masked(ops.logical_and(mask_h, mask_w), body, 0.0)

    total = _fold(grad, x.get_size(), window, "sum", term)
    dtype = x.get_dtype()
    return _pointwise(x, dtype, x.get_size(), lambda i: _store(total(i), dtype))


# -- average pooling ------------------------------------------------------------------
def _count(dim: _Dim, o: sympy.Expr, include_pad: bool) -> Any:
    """How many positions of window ``o`` the divisor counts: an int, or (dtype, value)."""
    lo, hi = (-dim.p, dim.n + dim.p) if include_pad else (0, dim.n)
    low, high = dim.extent()
    if low >= lo and high < hi:
        return dim.k
    dtype = dim.index_dtype
    start = ops.index_expr(o * dim.s - dim.p, dtype)
    end = ops.add(start, ops.constant(dim.k, dtype))
    end = ops.minimum(end, ops.constant(hi, dtype))
    return dtype, ops.sub(end, ops.maximum(start, ops.constant(lo, dtype)))


def _divide(value: Any, counts: Sequence[Any], math_dtype: torch.dtype) -> Any:
    """``value`` over the product of ``counts`` (ints, or (dtype, integer value) pairs)."""
    static = math.prod(c for c in counts if isinstance(c, int))
    dynamic = [c for c in counts if not isinstance(c, int)]
    divisor = ops.constant(float(static), math_dtype)
    for dtype, c in dynamic:
        divisor = ops.mul(divisor, ops.to_dtype(c, math_dtype, dtype))
    return ops.truediv(value, divisor)


def _divisors(h: _Dim, w: _Dim, oh: Any, ow: Any, include_pad: bool, override: Any) -> list[Any]:
    if override:
        return [int(override)]
    return [_count(h, oh, include_pad), _count(w, ow, include_pad)]


def _avg_pool(
    x: TensorBox, h: _Dim, w: _Dim, out_size: Sequence[Any], include_pad: bool, override: Any
) -> TensorBox:
    load, dtype = _loader(x), x.get_dtype()
    math_dtype = compute_dtype(dtype)
    size = [*x.get_size()[:-2], S(h.out), S(w.out)]

    total = _fold(x, size, (h.k, w.k), "sum", lambda i, j: _tap(load, h, w, i, j))

    def fn(index: Index) -> Any:
        counts = _divisors(h, w, index[-2], index[-1], include_pad, override)
        return _store(_divide(total(index), counts, math_dtype), dtype)

    return _pointwise(x, dtype, out_size, fn)


def _avg_pool_backward(
    grad: TensorBox, x: TensorBox, h: _Dim, w: _Dim, include_pad: bool, override: Any
) -> TensorBox:
    window = (math.ceil(h.k / h.s), math.ceil(w.k / w.s))
    load = _gathered(grad, h.k * w.k)
    math_dtype = compute_dtype(grad.get_dtype())

    def term(index: Index, offsets: Index) -> Any:
        *lead, ih, iw = index
        oh, mask_h = _covering(h, ih, offsets[0])
        ow, mask_w = _covering(w, iw, offsets[1])
        counts = _divisors(h, w, oh, ow, include_pad, override)
        body = lambda: _divide(load([*lead, oh, ow]), counts, math_dtype)  # noqa: E731
        return ops.masked(ops.logical_and(mask_h, mask_w), body, 0.0)

    total = _fold(grad, x.get_size(), window, "sum", term)
    dtype = x.get_dtype()
    return _pointwise(x, dtype, x.get_size(), lambda i: _store(total(i), dtype))


def _floating(x: TensorBox) -> None:
    if not x.get_dtype().is_floating_point:
        raise Unlowerable("average pooling of integers rounds like ATen's kernels, not lowered")


@register_lowering(*overloads("avg_pool2d", "default"))
def _avg_pool2d(
    x: TensorBox, kernel_size: Any, stride: Any = (), padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True, divisor_override: Any = None,
) -> TensorBox:  # fmt: skip
    _floating(x)
    out_size = out_meta().shape
    h, w = _dims(x.get_size(), out_size, kernel_size, stride, padding)
    return _avg_pool(x, h, w, out_size, count_include_pad, divisor_override)


@register_lowering(*overloads("avg_pool2d_backward", "default"))
def _avg_pool2d_backward(
    grad: TensorBox, x: TensorBox, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
    count_include_pad: bool, divisor_override: Any,
) -> TensorBox:  # fmt: skip
    _floating(x)
    h, w = _dims(x.get_size(), grad.get_size(), kernel_size, stride, padding)
    return _avg_pool_backward(grad, x, h, w, count_include_pad, divisor_override)


# -- adaptive average pooling ---------------------------------------------------------
def _bounds(o: sympy.Expr, n: int, out: int) -> tuple[sympy.Expr, sympy.Expr]:
    """Adaptive window ``o`` of ``out`` over ``n`` positions: ``[start, end)``."""
    return sizes.FloorDiv(o * n, out), sizes.FloorDiv((o + 1) * n + out - 1, out)


def _widths(n: int, out: int) -> list[int]:
    return [(-(-(o + 1) * n // out)) - (o * n // out) for o in range(out)]


def _uniform(x: TensorBox, out_size: Sequence[Any]) -> tuple[_Dim, _Dim] | None:
    """The adaptive pooling as a plain one (window ``n/out``) when it divides evenly."""
    n = [sizes.evaluate_int(e) for e in x.get_size()[-2:]]
    o = [int(e) for e in out_size[-2:]]
    if n[0] % o[0] or n[1] % o[1]:
        return None
    h, w = (_Dim(n[i], o[i], n[i] // o[i], n[i] // o[i], 0) for i in range(2))
    return h, w


def _adaptive_term(load: Any, n: Sequence[int], out: Sequence[int]) -> Term:
    def term(index: Index, offsets: Index) -> Any:
        *lead, oh, ow = index
        at, masks = list(lead), []
        for o, j, size, count in zip((oh, ow), offsets, n, out, strict=True):
            start, end = _bounds(o, size, count)
            at.append(start + j)
            if len(set(_widths(size, count))) > 1:  # ragged: mask offsets past the end
                pos = ops.index_expr(start + j, torch.int64)
                masks.append(ops.lt(pos, ops.index_expr(end, torch.int64)))
        return _masked(_all(masks), lambda: load(at), 0.0)

    return term


def _adaptive_counts(index: Index, n: Sequence[int], out: Sequence[int]) -> list[Any]:
    counts: list[Any] = []
    for o, size, count in zip(index, n, out, strict=True):
        start, end = _bounds(o, size, count)
        counts.append((torch.int64, ops.index_expr(end - start, torch.int64)))
    return counts


@register_lowering(*overloads("_adaptive_avg_pool2d", "default"))
def _adaptive_avg_pool2d(x: TensorBox, output_size: Sequence[int]) -> TensorBox:
    _floating(x)
    out_size = out_meta().shape
    if list(output_size) == [1, 1] and any(_is_symbolic(n) for n in x.get_size()[-2:]):
        # a global average: the mean over the image, whatever its size
        return LOWERINGS[torch.ops.aten.mean.dim](x, [-2, -1], True)
    uniform = _uniform(x, out_size)
    if uniform is not None:
        return _avg_pool(x, *uniform, out_size, True, None)
    n = [sizes.evaluate_int(e) for e in x.get_size()[-2:]]
    out = [int(e) for e in out_size[-2:]]
    window = (max(_widths(n[0], out[0])), max(_widths(n[1], out[1])))
    dtype = x.get_dtype()
    size = [*x.get_size()[:-2], S(out[0]), S(out[1])]
    total = _fold(x, size, window, "sum", _adaptive_term(_loader(x), n, out))

    def fn(index: Index) -> Any:
        counts = _adaptive_counts(index[-2:], n, out)
        return _store(_divide(total(index), counts, compute_dtype(dtype)), dtype)

    return _pointwise(x, dtype, out_size, fn)


def _adaptive_cover(n: int, out: int) -> int:
    """The most adaptive windows covering one position (they start at ``i*out // n``)."""
    most = 0
    for i in range(n):
        covering = [o for o in range(out) if o * n // out <= i < -(-(o + 1) * n // out)]
        assert covering[0] == i * out // n
        most = max(most, len(covering))
    return most


@register_lowering(*overloads("_adaptive_avg_pool2d_backward", "default"))
def _adaptive_avg_pool2d_backward(grad: TensorBox, x: TensorBox) -> TensorBox:
    _floating(x)
    uniform = _uniform(x, grad.get_size())
    if uniform is not None:
        return _avg_pool_backward(grad, x, *uniform, True, None)
    n = [sizes.evaluate_int(e) for e in x.get_size()[-2:]]
    out = [sizes.evaluate_int(e) for e in grad.get_size()[-2:]]
    window = (_adaptive_cover(n[0], out[0]), _adaptive_cover(n[1], out[1]))
    load = _gathered(grad, math.prod(-(-a // b) + 1 for a, b in zip(n, out, strict=True)))
    math_dtype = compute_dtype(grad.get_dtype())

    def term(index: Index, offsets: Index) -> Any:
        *lead, ih, iw = index
        at, masks = list(lead), []
        for i, j, size, count in zip((ih, iw), offsets, n, out, strict=True):
            o = sizes.FloorDiv(i * count, size) + j
            start, _ = _bounds(o, size, count)
            at.append(o)
            pos = ops.index_expr(o, torch.int64)
            masks.append(ops.lt(pos, ops.constant(count, torch.int64)))
            masks.append(ops.le(ops.index_expr(start, torch.int64), ops.index_expr(i, torch.int64)))
        counts = _adaptive_counts(at[-2:], n, out)
        return ops.masked(_all(masks), lambda: _divide(load(at), counts, math_dtype), 0.0)

    total = _fold(grad, x.get_size(), window, "sum", term)
    dtype = x.get_dtype()
    return _pointwise(x, dtype, x.get_size(), lambda i: _store(total(i), dtype))


# -- depthwise convolution ------------------------------------------------------------
def depthwise_convolution(
    x: TensorBox, weight: TensorBox, bias: TensorBox | None, stride: Any, padding: Any,
    dilation: Any, transposed: bool, groups: int,
) -> TensorBox:  # fmt: skip
    """A 2-D convolution whose every output channel reads one input channel (``groups`` is
    the input's channel count), over a window small enough to unroll: one pointwise sum of
    the window's taps times the channel's weights, fused with the ops around it like a
    pooling. Raises :class:`Unlowerable` for any other convolution (the library's call)."""
    if transposed or len(x.get_size()) != 4 or not x.get_dtype().is_floating_point:
        raise Unlowerable("not a 2-D floating-point forward convolution")
    channels, (out_channels, per_group, *window) = x.get_size()[1], weight.get_size()
    if groups == 1 or per_group != 1 or sizes.evaluate_int(channels) != groups:
        raise Unlowerable("not depthwise: an output channel reads several input channels")
    window = [sizes.evaluate_int(k) for k in window]
    if math.prod(window) > UNROLL:
        raise Unlowerable("window too big to unroll")
    out_size = out_meta().shape
    h, w = _dims(x.get_size(), out_size, window, stride, padding, dilation)
    multiplier = sizes.evaluate_int(out_channels) // groups
    load = _gathered(x, h.k * w.k)
    load_weight, load_bias = _loader(weight), None if bias is None else _loader(bias)
    dtype = x.get_dtype()

    def term(index: Index, offsets: Index) -> Any:
        n, c, oh, ow = index
        source = c if multiplier == 1 else sizes.FloorDiv(c, multiplier)
        value = _tap(load, h, w, [n, source, oh, ow], offsets)
        return ops.mul(value, load_weight([c, S(0), *offsets]))

    total = _fold(x, out_size, window, "sum", term)

    def fn(index: Index) -> Any:
        acc = total(index)
        return _store(acc if load_bias is None else ops.add(acc, load_bias([index[1]])), dtype)

    return _pointwise(x, dtype, out_size, fn)
