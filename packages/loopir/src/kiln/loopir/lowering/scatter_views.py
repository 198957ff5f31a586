"""Functionalized views and scatters: ``*_copy`` views, ``slice_scatter``,
``select_scatter``, ``as_strided_scatter`` (of a 1-D tensor), ``fill``, ``zero``,
``tril``/``triu`` and ``detach``.

A functionalization pass turns in-place writes through views into these; each
is a ``Pointwise`` choosing, per output element, the new or the old value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.ir.loops import Pointwise
from kiln.loopir.ir.views import TensorBox, pointwise_copy
from kiln.loopir.lowering import views
from kiln.loopir.lowering.common import canonical_dim, expand_to, origin, scalar
from kiln.loopir.lowering.fallback import fallback
from kiln.loopir.lowering.registry import LOWERINGS, overloads, register_lowering
from kiln.loopir.virtualized import V, ops

__all__: list[str] = []

Index = Sequence[sympy.Expr]

_COPY_OF = {
    ("view_copy", "default"): ("view", "default"),
    ("permute_copy", "default"): ("permute", "default"),
    ("expand_copy", "default"): ("expand", "default"),
    ("unsqueeze_copy", "default"): ("unsqueeze", "default"),
    ("squeeze_copy", "default"): ("squeeze", "default"),
    ("squeeze_copy", "dim"): ("squeeze", "dim"),
    ("squeeze_copy", "dims"): ("squeeze", "dims"),
    ("transpose_copy", "int"): ("transpose", "int"),
    ("t_copy", "default"): ("t", "default"),
    ("slice_copy", "Tensor"): ("slice", "Tensor"),
    ("select_copy", "int"): ("select", "int"),
    ("alias_copy", "default"): ("alias", "default"),
    ("diagonal_copy", "default"): ("diagonal", "default"),
    ("detach_copy", "default"): ("alias", "default"),
}


def _copying(view_lowering: Callable[..., TensorBox]) -> Callable[..., TensorBox]:
    def lower(*args: Any, **kwargs: Any) -> TensorBox:
        result = view_lowering(*args, **kwargs)
        return pointwise_copy(result, origin())

    return lower


def _register_copies() -> None:
    for (name, ovl), (view_name, view_ovl) in _COPY_OF.items():
        targets = overloads(name, ovl)
        view_ops = overloads(view_name, view_ovl)
        if targets and view_ops and view_ops[0] in LOWERINGS:
            register_lowering(*targets)(_copying(LOWERINGS[view_ops[0]]))


_register_copies()


@register_lowering(*overloads("detach", "default"))
def _detach(x: TensorBox) -> TensorBox:
    return x


def _select_values(base: TensorBox, chosen: Callable[[Index], Any], take: Any) -> TensorBox:
    """``take(index)`` (a bool) picks ``chosen(index)`` over ``base``'s element."""
    load = base.make_loader()
    dtype = base.get_dtype()

    def inner(index: Index) -> Any:
        mask = take(index)
        new = ops.masked(mask, lambda: chosen(index), 0)
        return ops.where(mask, new, load(index))

    return TensorBox.from_loops(
        Pointwise(base.get_device(), dtype, base.get_size(), origin(), inner)
    )


def _converted(src: TensorBox, dtype: torch.dtype) -> Callable[[Index], Any]:
    load = src.make_loader()
    if src.get_dtype() == dtype:
        return load
    return lambda idx: ops.to_dtype(load(idx), dtype, src.get_dtype())


@register_lowering(*overloads("slice_scatter", "default"))
def _slice_scatter(
    x: TensorBox,
    src: TensorBox,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    bounds = (x.get_size()[dim], start, end)
    lo: Any
    hi: Any
    if any(isinstance(v, sympy.Basic) and symbolic.is_symbolic(v) for v in bounds):
        if step != 1:
            raise StaticShapesOnly("slice_scatter with a step over a symbolic size")
        size = x.get_size()[dim]
        lo = views.clip_symbolic(start if start is not None else 0, size)
        hi = views.clip_symbolic(end if end is not None else size, size)
    else:
        n = sizes.evaluate_int(x.get_size()[dim])
        lo = views.clip_index(start if start is not None else 0, n)
        hi = views.clip_index(end if end is not None else n, n)
    load = _converted(src, x.get_dtype())

    def take(index: Index) -> Any:
        pos = ops.index_expr(index[dim], torch.int64)
        inside = ops.logical_and(ops.ge(pos, _bound(lo)), ops.lt(pos, _bound(hi)))
        if step == 1:
            return inside
        phase = ops.index_expr(
            sizes.ModularIndexing(index[dim] + (step - lo % step), 1, step), torch.int64
        )
        return ops.logical_and(inside, ops.eq(phase, ops.constant(0, torch.int64)))

    def chosen(index: Index) -> Any:
        local = [sizes.FloorDiv(e - lo, step) if i == dim else e for i, e in enumerate(index)]
        return load(local)

    return _select_values(x, chosen, take)


def _bound(value: Any) -> Any:
    """An int, or a symbolic size (this call's value)."""
    if isinstance(value, sympy.Basic) and symbolic.is_symbolic(value):
        return ops.index_expr(value, torch.int64)
    return ops.constant(value, torch.int64)


@register_lowering(*overloads("select_scatter", "default"))
def _select_scatter(x: TensorBox, src: TensorBox, dim: int, index: int) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    pos: Any
    if symbolic.is_symbolic(x.get_size()[dim]):
        size = x.get_size()[dim]
        pos = index + size if index < 0 else sympy.Integer(index)
        inside = sympy.Ge(pos, 0) if index < 0 else sympy.Gt(size - index, 0)
        if not symbolic.provably(inside):
            raise StaticShapesOnly(f"select_scatter {index} of size {size}: not always inside")
    else:
        n = sizes.evaluate_int(x.get_size()[dim])
        pos = index + n if index < 0 else index
    load = _converted(src, x.get_dtype())

    def take(idx: Index) -> Any:
        return ops.eq(ops.index_expr(idx[dim], torch.int64), _bound(pos))

    return _select_values(x, lambda idx: load([*idx[:dim], *idx[dim + 1 :]]), take)


@register_lowering(*overloads("as_strided_scatter", "default"))
def _as_strided_scatter(
    x: TensorBox,
    src: TensorBox,
    size: Sequence[int],
    stride: Sequence[int],
    storage_offset: int | None = None,
) -> Any:
    """``src`` written over a contiguous run of a 1-D ``x`` (autograd's ``as_strided``
    backward: the run is all of a zero tensor, as in ConvNeXt's pooled head). A strided
    view of an n-D tensor depends on its memory layout: ATen's op then."""
    offset = storage_offset or 0
    shape = [sizes.sympify(n) for n in size]
    numel = sizes.static_int(sizes.product(x.get_size()))
    run = sizes.static_int(sizes.product(shape))
    steps = zip(size, stride, sizes.contiguous_strides(shape), strict=True)
    dense = all(n == 1 or s == c for n, s, c in steps)
    if x.dim() != 1 or numel is None or run is None or offset + run > numel or not dense:
        return fallback(V.graph.current_op, (x, src, size, stride, storage_offset), {})
    load = _converted(src, x.get_dtype())

    def take(index: Index) -> Any:
        pos = ops.index_expr(index[0], torch.int64)
        return ops.logical_and(
            ops.ge(pos, ops.constant(offset, torch.int64)),
            ops.lt(pos, ops.constant(offset + run, torch.int64)),
        )

    return _select_values(x, lambda i: load(sizes.unflatten_index(i[0] - offset, shape)), take)


@register_lowering(*overloads("fill", "Scalar", "Tensor"))
def _fill(x: TensorBox, value: Any) -> TensorBox:
    dtype = x.get_dtype()
    if isinstance(value, TensorBox):
        src = _converted(expand_to(value, x.get_size()), dtype)
        return TensorBox.from_loops(Pointwise(x.get_device(), dtype, x.get_size(), origin(), src))
    return TensorBox.from_loops(
        Pointwise(x.get_device(), dtype, x.get_size(), origin(), lambda i: scalar(value, dtype))
    )


@register_lowering(*overloads("zero", "default"))
def _zero(x: TensorBox) -> TensorBox:
    return _fill(x, 0)


def _triangle(lower: bool) -> Callable[..., TensorBox]:
    def lower_fn(x: TensorBox, diagonal: int = 0) -> TensorBox:
        load, dtype = x.make_loader(), x.get_dtype()

        def inner(index: Index) -> Any:
            gap = ops.index_expr(index[-1] - index[-2], torch.int64)
            limit = ops.constant(diagonal, torch.int64)
            keep = ops.le(gap, limit) if lower else ops.ge(gap, limit)
            return ops.where(keep, load(index), ops.constant(0, dtype))

        return TensorBox.from_loops(Pointwise(x.get_device(), dtype, x.get_size(), origin(), inner))

    return lower_fn


register_lowering(*overloads("tril", "default"))(_triangle(True))
register_lowering(*overloads("triu", "default"))(_triangle(False))
