"""Reduction lowerings: sum, mean, prod, amax/amin, max/min, argmax/argmin, any/all,
var/std/var_mean (Welford), and cumsum (as a masked reduction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.ir.loops import Reduction
from kiln.loopir.ir.views import StorageBox, TensorBox
from kiln.loopir.lowering.common import compute_dtype, make_pointwise, origin, out_dtype
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.lowering.views import flat_view, unsqueeze
from kiln.loopir.virtualized import ops

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
    """A realized ``Reduction`` of ``x`` over ``dim`` with accumulator/result ``dtype``."""
    if x.dim() == 0:
        x = unsqueeze(x, 0)
        dim = [0]
    rdims = _dims(x, dim)
    kept = [i for i in range(x.dim()) if i not in rdims]
    size = x.get_size()
    ranges = tuple(size[i] for i in kept)
    rranges = tuple(size[i] for i in rdims)
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
    out = TensorBox(box)
    if keepdim:
        for d in rdims:
            out = unsqueeze(out, d)
    return out


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
    n = float(sizes.evaluate_int(count))
    return make_pointwise(lambda v: ops.truediv(v, ops.constant(n, math)), [total], dtype=result)


def _extreme(kind: str) -> Any:
    def lower(x: TensorBox, dim: Any = None, keepdim: bool = False) -> TensorBox:
        result = out_dtype()
        return cast(reduce(x, dim, keepdim, kind, compute_dtype(result)), result)

    return lower


register_lowering(*overloads("amax", "default"), *overloads("max", "default"))(_extreme("max"))
register_lowering(*overloads("amin", "default"), *overloads("min", "default"))(_extreme("min"))


def _arg(kind: str) -> Any:
    def lower(x: TensorBox, dim: int | None = None, keepdim: bool = False) -> TensorBox:
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
    mean = reduce(x, dim, keepdim, "welford_reduce", math, output_index=0)
    m2 = reduce(x, dim, keepdim, "welford_reduce", math, output_index=1)
    count = (
        sizes.evaluate_int(sizes.product(x.get_size()[d] for d in _dims(x, dim))) if x.dim() else 1
    )
    denom = float(max(0, count - correction))

    def var_fn(v: Any) -> Any:
        return ops.truediv(v, ops.constant(denom, math))

    var = make_pointwise(var_fn, [m2], dtype=math)
    return var, mean, result


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
