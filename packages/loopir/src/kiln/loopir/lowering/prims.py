"""``torch.ops.prims`` lowerings: the primitives decompositions from ``torch._refs`` emit.

Elementwise prims take operands already broadcast and promoted, so most map onto
the matching ATen lowering; shape prims (``broadcast_in_dim``, ``collapse_view``,
``split_dim``) become views; reduction prims name their dims explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.ir.views import TensorBox, View
from kiln.loopir.lowering import reductions, views
from kiln.loopir.lowering.common import compute_dtype, origin, out_dtype
from kiln.loopir.lowering.registry import LOWERINGS, register_lowering

__all__: list[str] = []

prims = torch.ops.prims
aten = torch.ops.aten

_SAME_AS_ATEN = {
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor,
    "maximum": aten.maximum.default, "minimum": aten.minimum.default, "eq": aten.eq.Tensor,
    "ne": aten.ne.Tensor, "lt": aten.lt.Tensor, "le": aten.le.Tensor, "gt": aten.gt.Tensor,
    "ge": aten.ge.Tensor, "where": aten.where.self, "pow": aten.pow.Tensor_Tensor,
    "fmod": aten.fmod.Tensor, "atan2": aten.atan2.default,
    "bitwise_and": aten.bitwise_and.Tensor, "bitwise_or": aten.bitwise_or.Tensor,
    "bitwise_xor": aten.bitwise_xor.Tensor, "bitwise_not": aten.bitwise_not.default,
    "abs": aten.abs.default, "neg": aten.neg.default, "exp": aten.exp.default,
    "exp2": aten.exp2.default, "expm1": aten.expm1.default, "log": aten.log.default,
    "log1p": aten.log1p.default, "log2": aten.log2.default, "sqrt": aten.sqrt.default,
    "rsqrt": aten.rsqrt.default, "sin": aten.sin.default, "cos": aten.cos.default,
    "tanh": aten.tanh.default, "erf": aten.erf.default, "floor": aten.floor.default,
    "ceil": aten.ceil.default, "trunc": aten.trunc.default, "round": aten.round.default,
    "sign": aten.sign.default, "reciprocal": aten.reciprocal.default,
    "isfinite": aten.isfinite.default, "view_of": aten.alias.default,
}  # fmt: skip


def _register_same() -> None:
    for name, aten_op in _SAME_AS_ATEN.items():
        prim = getattr(prims, name, None)
        if prim is not None and aten_op in LOWERINGS:
            register_lowering(prim.default)(LOWERINGS[aten_op])


_register_same()


@register_lowering(prims.div.default)
def _div(a: Any, b: Any) -> TensorBox:
    div = LOWERINGS[aten.div.Tensor_mode]
    if out_dtype().is_floating_point:
        return div(a, b)  # type: ignore[no-any-return]
    return div(a, b, rounding_mode="trunc")  # type: ignore[no-any-return]


def _reduction(kind: str) -> Any:
    def lower(x: TensorBox, dims: Sequence[int] | None, *, output_dtype: Any = None) -> TensorBox:
        result = out_dtype()
        math = compute_dtype(result)
        out = reductions.reduce(x, dims, False, kind, math)
        return reductions.cast(out, result)

    return lower


register_lowering(prims.sum.default)(_reduction("sum"))
register_lowering(prims.prod.default)(_reduction("prod"))
register_lowering(prims.amax.default)(_reduction("max"))
register_lowering(prims.amin.default)(_reduction("min"))


@register_lowering(prims.var.default)
def _var(
    x: TensorBox, dims: Sequence[int] | None, correction: float = 1, *, output_dtype: Any = None
) -> TensorBox:
    var, _, result = reductions.welford(x, dims, False, float(correction))
    return reductions.cast(var, result)


@register_lowering(prims.broadcast_in_dim.default)
def _broadcast_in_dim(
    x: TensorBox, shape: Sequence[int], broadcast_dimensions: Sequence[int]
) -> TensorBox:
    in_size = x.get_size()
    dims = list(broadcast_dimensions)

    def reindex(index: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        return [sympy.S.Zero if in_size[i] == 1 else index[d] for i, d in enumerate(dims)]

    size = tuple(sizes.sympify(s) for s in shape)
    return TensorBox(View(x.data, size, reindex, origin()))


@register_lowering(prims.squeeze.default)
def _squeeze(x: TensorBox, dimensions: Sequence[int]) -> TensorBox:
    return views.squeeze_dims(x, dimensions)


@register_lowering(prims.transpose.default)
def _transpose(x: TensorBox, permutation: Sequence[int]) -> TensorBox:
    return views.permute(x, permutation)


@register_lowering(prims.collapse_view.default)
def _collapse_view(x: TensorBox, start: int, end: int) -> TensorBox:
    size = list(x.get_size())  # dims start..end inclusive become one
    merged = sizes.product(size[start : end + 1])
    return views.view(x, [*size[:start], merged, *size[end + 1 :]])


@register_lowering(prims.split_dim.default)
def _split_dim(x: TensorBox, dim: int, outer_length: int) -> TensorBox:
    size = list(x.get_size())
    inner = sizes.quotient(size[dim], outer_length)
    return views.view(x, [*size[:dim], sizes.sympify(outer_length), inner, *size[dim + 1 :]])
