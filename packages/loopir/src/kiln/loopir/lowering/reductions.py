"""Reduction lowerings: sum, mean, prod, amax/amin, max/min, argmax/argmin, any/all,
var/std/var_mean (Welford), and cumsum (as a masked reduction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes, symbolic
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.ir.loops import Pointwise, Reduction
from kiln.loopir.ir.views import StorageBox, TensorBox
from kiln.loopir.lowering.common import compute_dtype, make_pointwise, origin, out_dtype
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.lowering.views import flat_view, permute, unsqueeze, view
from kiln.loopir.virtualized import V, ops, set_ops_handler

__all__ = ["reduce", "cast", "welford"]

Index = Sequence[sympy.Expr]


def _dims(x: TensorBox, dim: Any) -> list[int]:
    n = x.dim()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(n))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % n if n else 0 for d in dims})


def _merge(kept: list[int], rdims: list[int], index: Index, rindex: Index) -> list[sympy.Expr]:
    full: dict[int, sympy.Expr] = dict(zip(kept, index, strict=True))
    full.update(zip(rdims, rindex, strict=True))
    return [full[i] for i in range(len(kept) + len(rdims))]


def reduce(
    x: TensorBox,
    dim: Any,
    keepdim: bool,
    reduction_type: str,
    dtype: torch.dtype,
    *,
    output_index: int | None = None,
    with_index: bool = False,
) -> TensorBox:
    """A realized ``Reduction`` of ``x`` over ``dim`` with accumulator/result ``dtype``;
    a long one with few results in two steps (see :func:`_pieces`)."""
    scalar = x.dim() == 0  # reduced as one element; its result stays 0-d, keepdim or not
    if scalar:
        x = unsqueeze(x, 0)
        dim = [0]
    rdims = _dims(x, dim)
    pieces = 1 if with_index or output_index is not None else _pieces(x, rdims)
    if pieces > 1:
        parts = _split(x, rdims, pieces)
        partial = _reduction(parts, [parts.dim() - 1], reduction_type, dtype)
        out = _reduction(partial, [0], reduction_type, dtype)
    else:
        out = _reduction(x, rdims, reduction_type, dtype, output_index, with_index)
    if keepdim and not scalar:
        for d in rdims:
            out = unsqueeze(out, d)
    return out


def _reduction(
    x: TensorBox,
    rdims: list[int],
    reduction_type: str,
    dtype: torch.dtype,
    output_index: int | None = None,
    with_index: bool = False,
) -> TensorBox:
    kept = [i for i in range(x.dim()) if i not in rdims]
    size = x.get_size()
    ranges = tuple(size[i] for i in kept)
    rranges = tuple(size[i] for i in rdims)
    if sizes.static_int(sizes.product(rranges)) == 0:
        return _over_nothing(x, ranges, reduction_type, dtype, output_index)
    load = x.make_loader()
    src = x.get_dtype()
    math = dtype if reduction_type not in ("max", "min", "argmax", "argmin") else compute_dtype(src)

    def inner(index: Index, rindex: Index) -> Any:
        value = load(_merge(kept, rdims, index, rindex))
        if src != math:
            value = ops.to_dtype(value, math, src)
        if with_index:
            return value, ops.index_expr(sizes.flat_index(rindex, rranges), torch.int64)
        return value

    red = Reduction(
        x.get_device(), dtype, ranges, origin(), rranges, reduction_type, src, inner, output_index,
        source_ranges=tuple(size), source_order=tuple(kept + rdims),
    )  # fmt: skip
    box = StorageBox(red)
    box.realize()
    return TensorBox(box)


_MIN_PIECE = 4096
"""Elements one piece of a split reduction folds at least: fewer would spend more on the
second step and the partial results than the split gains."""

_OUTER_WIDTH = 32
"""Results one program of an outer reduction folds at once (see :func:`_reads_along_kept`)."""


def _reads_along_kept(x: TensorBox, rdims: list[int]) -> bool:
    """Whether more of ``x``'s loads step by one along a kept dim than along a reduced one.

    Such an outer reduction (a bias gradient: the column sums of a (tokens, features)
    matrix) folds about ``_OUTER_WIDTH`` neighbouring results per GPU program, to read
    them coalesced; so it runs that many times fewer programs than it has results.
    """
    size = x.get_size()
    index = [sizes.index_symbol("i", n) for n in range(len(size))]
    handler = ReadWriteHandler()
    with set_ops_handler(handler):
        x.make_loader()(index)
    ranges = {s: n for s, n in zip(index, map(sizes.static_int, size), strict=True) if n}
    along_kept = along_reduced = 0
    for dep in handler.reads:
        # a view's digits rejoined ((64, 49, C) read as (3136, C)); a dim stepping by one
        # outside any division counts, whatever the others do (Swin's rolled windows)
        expr = sympy.expand(sizes.simplify_with_ranges(dep.index, ranges))
        unit = [d for d, s in enumerate(index) if size[d] != 1 and expr.coeff(s) == 1]
        if unit and unit[0] in rdims:
            along_reduced += 1
        elif unit:
            along_kept += 1
    return along_kept > along_reduced


def _pieces(x: TensorBox, rdims: list[int]) -> int:
    """How many pieces to cut each row of a long reduction with few programs into.

    One program folds one row (an outer reduction: ``_OUTER_WIDTH`` rows), so BatchNorm's
    per-channel statistics (64 rows of 400k elements) would keep a few dozen GPU cores busy,
    as would the bias gradients of a transformer (768 columns of 8192 tokens). The backend's
    ``reduction_split_rows`` (see :mod:`kiln.loopir.traits`) says how many programs it wants
    to run at once; each row is cut into a power of two of equal pieces (none ragged),
    reduced to partial results, which a second, small reduction folds (Inductor's split
    reduction). 1: not cut.
    """
    rows = V.graph.backend_traits(x.get_device()).reduction_split_rows
    size = x.get_size()
    numel = sizes.static_int(sizes.product(s for i, s in enumerate(size) if i not in rdims))
    rnumel = sizes.static_int(sizes.product(size[i] for i in rdims))
    if not rows or numel is None or rnumel is None:
        return 1
    width = min(_OUTER_WIDTH, numel) if _reads_along_kept(x, rdims) else 1
    programs = -(-numel // width)
    if programs * 4 > rows:
        return 1
    pieces = 1
    while (
        programs * pieces * 2 <= rows
        and rnumel % (pieces * 2) == 0
        and rnumel // (pieces * 2) * width >= _MIN_PIECE
    ):
        pieces *= 2
    return pieces


def _split(x: TensorBox, rdims: list[int], pieces: int) -> TensorBox:
    """``x`` viewed as ``(pieces, kept dims..., rest)``: each row cut into equal pieces.

    The pieces are the outer dim of the partial results, so neighbouring rows of the first
    step are neighbouring kept elements: channels, contiguous in an NHWC tensor.
    """
    kept = [i for i in range(x.dim()) if i not in rdims]
    order = kept + rdims
    if order != list(range(x.dim())):
        x = permute(x, order)
    size = x.get_size()
    n = len(kept)
    rnumel = sizes.product(size[n:])
    x = view(x, [*size[:n], pieces, sizes.quotient(rnumel, pieces)])
    return permute(x, [n, *range(n), n + 1])


def cast(x: TensorBox, dtype: torch.dtype) -> TensorBox:
    if x.get_dtype() == dtype:
        return x
    return make_pointwise(lambda v: v, [x], dtype=dtype, math_dtype=x.get_dtype())


@register_lowering(*overloads("sum", "default", "dim_IntList"))
def _sum(x: TensorBox, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorBox:
    result = out_dtype()
    return cast(reduce(x, dim, keepdim, "sum", compute_dtype(result)), result)


@register_lowering(*overloads("prod", "default", "dim_int"))
def _prod(x: TensorBox, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorBox:
    result = out_dtype()
    return cast(reduce(x, dim, keepdim, "prod", compute_dtype(result)), result)


@register_lowering(*overloads("mean", "default", "dim"))
def _mean(x: TensorBox, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorBox:
    result = out_dtype()
    math = compute_dtype(result)
    total = reduce(x, dim, keepdim, "sum", math)
    count = sizes.product(x.get_size()[d] for d in _dims(x, dim)) if x.dim() else 1
    return make_pointwise(lambda v: ops.truediv(v, _count(count, math)), [total], dtype=result)


def _count(count: sympy.Expr | int, dtype: torch.dtype) -> Any:
    """A number of elements as a value: a constant, or (symbolic) this call's size."""
    if symbolic.is_symbolic(count):
        return ops.index_expr(sympy.sympify(count), dtype)
    return ops.constant(float(sizes.evaluate_int(count)), dtype)


# each reduction's value over zero elements (welford: mean, then m2)
_OVER_NOTHING: dict[str, float | bool] = {"sum": 0, "xor_sum": 0, "prod": 1, "any": False}


def _over_nothing(
    x: TensorBox,
    ranges: tuple[sympy.Expr, ...],
    reduction_type: str,
    dtype: torch.dtype,
    output_index: int | None,
) -> TensorBox:
    """A reduction over zero elements is a constant, with no loop at all.

    As a loop it would be one whose body never runs, yet a backend may compute what the body
    reads outside the loop (an index loaded from a tensor of zero elements): a read past the
    end of an input.
    """
    if reduction_type == "welford_reduce":
        value: float | bool = float("nan") if output_index == 0 else 0
    elif reduction_type in _OVER_NOTHING:
        value = _OVER_NOTHING[reduction_type]
    else:
        raise RuntimeError(f"{reduction_type}() over zero elements has no value (eager raises)")
    box = StorageBox(
        Pointwise(x.get_device(), dtype, ranges, origin(), lambda idx: ops.constant(value, dtype))
    )
    box.realize()
    return TensorBox(box)


def _refuse_empty(kind: str, x: TensorBox, dim: Any) -> None:
    """Raise where eager does: max, min and their arg forms have no value over zero elements.

    A kernel would return its start value (-inf, +inf, index 0) instead; the raise makes the
    graph run eagerly, where the op raises its own error.
    """
    if not x.dim():
        return
    extent = sizes.product(x.get_size()[d] for d in _dims(x, dim))
    if symbolic.is_symbolic(extent):
        if not symbolic.provably(sympy.Gt(extent, 0)):
            raise StaticShapesOnly(f"{kind}() over {extent} elements, which may be 0")
    elif sizes.evaluate_int(extent) == 0:
        raise RuntimeError(f"{kind}() over zero elements has no value (eager raises)")


def _extreme(kind: str) -> Any:
    def lower(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
        _refuse_empty(kind, x, dim)
        result = out_dtype()
        return cast(reduce(x, dim, keepdim, kind, compute_dtype(result)), result)

    return lower


register_lowering(*overloads("amax", "default"), *overloads("max", "default"))(_extreme("max"))
register_lowering(*overloads("amin", "default"), *overloads("min", "default"))(_extreme("min"))


def _arg(kind: str) -> Any:
    def lower(x: TensorBox, dim: int | None = None, keepdim: bool = False) -> TensorBox:
        _refuse_empty(kind, x, dim)
        if dim is None:
            flat = reduce(flat_view(x), [0], False, kind, torch.int64, with_index=True)
            if keepdim:
                for d in range(x.dim()):
                    flat = unsqueeze(flat, d)
            return flat
        return reduce(x, dim, keepdim, kind, torch.int64, with_index=True)

    return lower


register_lowering(*overloads("argmax", "default"))(_arg("argmax"))
register_lowering(*overloads("argmin", "default"))(_arg("argmin"))


def _value_and_index(kind: str) -> Any:
    def lower(x: TensorBox, dim: int, keepdim: bool = False) -> tuple[TensorBox, TensorBox]:
        values = _extreme(kind)(x, dim, keepdim)
        indices = _arg("arg" + kind)(x, dim, keepdim)
        return values, indices

    return lower


register_lowering(*overloads("max", "dim"))(_value_and_index("max"))
register_lowering(*overloads("min", "dim"))(_value_and_index("min"))


@register_lowering(*overloads("any", "default", "dim", "dims"))
def _any(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
    as_bool = make_pointwise(lambda v: v, [x], dtype=torch.bool, math_dtype=torch.bool)
    return reduce(as_bool, dim, keepdim, "any", torch.bool)


@register_lowering(*overloads("all", "default", "dim", "dims"))
def _all(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
    negated = make_pointwise(ops.logical_not, [x], dtype=torch.bool, math_dtype=torch.bool)
    found = reduce(negated, dim, keepdim, "any", torch.bool)
    return make_pointwise(ops.logical_not, [found], dtype=torch.bool, math_dtype=torch.bool)


def welford(
    x: TensorBox, dim: Any, keepdim: bool, correction: float
) -> tuple[TensorBox, TensorBox, torch.dtype]:
    result = out_dtype()
    math = compute_dtype(result)
    rdims = _dims(x, dim) if x.dim() else []
    pieces = _pieces(x, rdims) if x.dim() else 1
    if pieces > 1:
        mean, m2 = _split_welford(x, rdims, keepdim, pieces, math)
    else:
        mean = reduce(x, dim, keepdim, "welford_reduce", math, output_index=0)
        m2 = reduce(x, dim, keepdim, "welford_reduce", math, output_index=1)
    count = sizes.product(x.get_size()[d] for d in rdims)
    if symbolic.is_symbolic(count) and correction == int(correction):
        size = sympy.Max(0, count - int(correction))

        def var_fn(v: Any) -> Any:
            return ops.truediv(v, ops.index_expr(size, math))
    else:
        denom = float(max(0, sizes.evaluate_int(count) - correction))

        def var_fn(v: Any) -> Any:
            return ops.truediv(v, ops.constant(denom, math))

    var = make_pointwise(var_fn, [m2], dtype=math)
    return var, mean, result


def _split_welford(
    x: TensorBox, rdims: list[int], keepdim: bool, pieces: int, math: torch.dtype
) -> tuple[TensorBox, TensorBox]:
    """Mean and m2 from each piece's (Chan et al.): pieces are equal, so the mean is the
    pieces' mean and m2 adds each piece's spread around it."""
    parts = _split(x, rdims, pieces)
    last = [parts.dim() - 1]
    means = _reduction(parts, last, "welford_reduce", math, output_index=0)
    m2s = _reduction(parts, last, "welford_reduce", math, output_index=1)
    total = _reduction(means, [0], "sum", math)
    mean = make_pointwise(lambda v: ops.mul(v, ops.constant(1 / pieces, math)), [total], dtype=math)
    length = float(sizes.evaluate_int(parts.get_size()[-1]))

    def spread(m2: Any, piece_mean: Any, whole_mean: Any) -> Any:
        d = ops.sub(piece_mean, whole_mean)
        return ops.add(m2, ops.mul(ops.constant(length, math), ops.mul(d, d)))

    terms = make_pointwise(spread, [m2s, means, unsqueeze(mean, 0)], dtype=math)
    m2 = _reduction(terms, [0], "sum", math)
    if keepdim:
        for d in rdims:
            mean, m2 = unsqueeze(mean, d), unsqueeze(m2, d)
    return mean, m2


def _correction(correction: Any, unbiased: Any = None) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


@register_lowering(*overloads("var", "correction"))
def _var(
    x: TensorBox, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> TensorBox:
    var, _, result = welford(x, dim, keepdim, _correction(correction))
    return cast(var, result)


@register_lowering(*overloads("std", "correction"))
def _std(
    x: TensorBox, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> TensorBox:
    var, _, result = welford(x, dim, keepdim, _correction(correction))
    return make_pointwise(ops.sqrt, [var], dtype=result)


@register_lowering(*overloads("var_mean", "correction"))
def _var_mean(
    x: TensorBox, dim: Any = None, *, correction: Any = None, keepdim: bool = False
) -> tuple[TensorBox, TensorBox]:
    var, mean, result = welford(x, dim, keepdim, _correction(correction))
    return cast(var, result), cast(mean, result)


@register_lowering(*overloads("cumsum", "default"))
def _cumsum(x: TensorBox, dim: int, *, dtype: Any = None) -> TensorBox:
    result = out_dtype()
    math = compute_dtype(result)
    if x.dim() == 0:
        return cast(x, result)
    d = dim % x.dim()
    size = x.get_size()
    load = x.make_loader()
    src = x.get_dtype()

    def inner(index: Index, rindex: Index) -> Any:
        j = rindex[0]
        mask = ops.le(ops.index_expr(j, torch.int64), ops.index_expr(index[d], torch.int64))

        def body() -> Any:
            v = load([j if i == d else e for i, e in enumerate(index)])
            return ops.to_dtype(v, math, src) if src != math else v

        return ops.masked(mask, body, 0)

    red = Reduction(x.get_device(), math, size, origin(), (size[d],), "sum", src, inner)
    box = StorageBox(red)
    box.realize()
    return cast(TensorBox(box), result)
