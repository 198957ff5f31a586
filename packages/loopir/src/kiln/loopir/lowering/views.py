"""View lowerings: index remapping with no copies (view, permute, slice, flip, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import StaticShapesOnly, Unlowerable
from kiln.loopir.ir.buffers import Buffer
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.strided import as_strided_view, copy_like
from kiln.loopir.ir.views import ReinterpretView, TensorBox, View
from kiln.loopir.lowering.common import canonical_dim, expand_to
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.virtualized import V

__all__ = ["view", "permute", "slice_", "unsqueeze", "squeeze_dims", "flat_view"]

S = sympy.Integer
Index = Sequence[sympy.Expr]


def _remap(x: TensorBox, size: Sequence[sympy.Expr], reindex: Any, name: str) -> TensorBox:
    return TensorBox(View(x.data, tuple(size), reindex, name))


def _resolve_size(x: TensorBox, size: Sequence[Any]) -> list[sympy.Expr]:
    out = [sizes.sympify(s) for s in size]
    if any(s == -1 for s in out):
        known = sizes.product([s for s in out if s != -1])
        out = [sizes.quotient(x.numel(), known) if s == -1 else s for s in out]
    return out


def _view_strides(layout: Layout, new: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...] | None:
    """Strides of ``new`` viewing a strided tensor without a copy, or None (ATen's
    ``computeStride``: each run of dims that is contiguous in memory may be re-split)."""
    if layout.is_contiguous():
        return tuple(sizes.contiguous_strides(new))
    values = [sizes.static_int(v) for v in (*layout.size, *layout.stride, *new)]
    ints = [v for v in values if v is not None]
    if len(ints) != len(values):
        return None
    ndim = len(layout.size)
    old, old_stride, shape = ints[:ndim], ints[ndim : 2 * ndim], ints[2 * ndim :]
    if 0 in old or not old:
        return None
    out = [0] * len(shape)
    view_d = len(shape) - 1
    base_stride, tensor_numel, view_numel = old_stride[-1], 1, 1
    for d in reversed(range(ndim)):
        tensor_numel *= old[d]
        if d == 0 or (old[d - 1] != 1 and old_stride[d - 1] != tensor_numel * base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or shape[view_d] == 1):
                out[view_d] = view_numel * base_stride
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base_stride, tensor_numel, view_numel = old_stride[d - 1], 1, 1
    return tuple(S(v) for v in out) if view_d == -1 else None


def view(x: TensorBox, size: Sequence[Any]) -> TensorBox:
    """``x`` with a new shape and the same row-major element order."""
    new = _resolve_size(x, size)
    old = x.get_size()
    if tuple(new) == tuple(old):
        return x
    base = as_strided_view(x)
    if isinstance(base, (Buffer, ReinterpretView)):
        layout = base.layout
        strides = _view_strides(layout, new)
        if strides is not None:
            target = base.buffer if isinstance(base, ReinterpretView) else base
            lay = Layout(layout.device, layout.dtype, tuple(new), strides, layout.offset)
            return TensorBox(ReinterpretView(target, lay))

    def reindex(index: Index) -> list[sympy.Expr]:
        return sizes.reshape_index(index, new, old)

    return _remap(x, new, reindex, "view")


def flat_view(x: TensorBox) -> TensorBox:
    return view(x, [x.numel()])


register_lowering(*overloads("view", "default"), *overloads("_unsafe_view", "default"))(view)
register_lowering(*overloads("reshape", "default"))(view)


@register_lowering(*overloads("alias", "default"), *overloads("lift_fresh", "default"))
def _alias(x: TensorBox) -> TensorBox:
    return x


@register_lowering(*overloads("expand", "default"))
def _expand(x: TensorBox, size: Sequence[Any], implicit: bool = False) -> TensorBox:
    lead = len(size) - x.dim()
    target = [x.get_size()[i - lead] if s == -1 else sizes.sympify(s) for i, s in enumerate(size)]
    return expand_to(x, target)


@register_lowering(*overloads("permute", "default"))
def permute(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    n = x.dim()
    dims = [canonical_dim(d, n) for d in dims]
    size = [x.get_size()[d] for d in dims]

    def reindex(index: Index) -> list[sympy.Expr]:
        out: list[sympy.Expr] = [S(0)] * n
        for i, d in enumerate(dims):
            out[d] = index[i]
        return out

    return _remap(x, size, reindex, "permute")


@register_lowering(*overloads("transpose", "int"))
def _transpose(x: TensorBox, d0: int, d1: int) -> TensorBox:
    n = x.dim()
    if n < 2:
        return x
    dims = list(range(n))
    a, b = canonical_dim(d0, n), canonical_dim(d1, n)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


@register_lowering(*overloads("t", "default"))
def _t(x: TensorBox) -> TensorBox:
    return _transpose(x, 0, 1) if x.dim() == 2 else x


@register_lowering(*overloads("unsqueeze", "default"))
def unsqueeze(x: TensorBox, dim: int) -> TensorBox:
    dim = canonical_dim(dim, x.dim() + 1)
    size = list(x.get_size())
    size.insert(dim, S(1))
    return _remap(x, size, lambda index: [*index[:dim], *index[dim + 1 :]], "unsqueeze")


def squeeze_dims(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    """``x`` without the listed dims of size 1 (others are kept, as torch does)."""
    n = x.dim()
    if n == 0:  # a 0-d tensor squeezed over dim 0 or -1 is itself
        return x
    drop = {canonical_dim(d, n) for d in dims if x.get_size()[canonical_dim(d, n)] == 1}
    if not drop:
        return x
    size = [s for i, s in enumerate(x.get_size()) if i not in drop]

    def reindex(index: Index) -> list[sympy.Expr]:
        it = iter(index)
        return [S(0) if i in drop else next(it) for i in range(n)]

    return _remap(x, size, reindex, "squeeze")


@register_lowering(*overloads("squeeze", "default", "dim", "dims"))
def _squeeze(x: TensorBox, dim: int | Sequence[int] | None = None) -> TensorBox:
    if dim is None:
        return squeeze_dims(x, range(x.dim()))
    return squeeze_dims(x, [dim] if isinstance(dim, int) else dim)


def clip_index(v: int, n: int) -> int:
    if v < 0:
        v += n
    return min(max(v, 0), n)


@register_lowering(*overloads("slice", "Tensor"))
def slice_(
    x: TensorBox, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    bounds = (x.get_size()[dim], start, end)
    if any(isinstance(v, sympy.Basic) and symbolic.is_symbolic(v) for v in bounds):
        return _slice_symbolic(x, dim, start, end, step)
    n = sizes.evaluate_int(x.get_size()[dim])
    lo = clip_index(start if start is not None else 0, n)
    hi = clip_index(end if end is not None else n, n)
    length = max(0, (hi - lo + step - 1) // step)
    if (lo, length, step) == (0, n, 1):
        return x
    size = list(x.get_size())
    size[dim] = S(length)

    def reindex(index: Index) -> list[sympy.Expr]:
        out = list(index)
        out[dim] = lo + out[dim] * step
        return out

    return _remap(x, size, reindex, "slice")


_TO_THE_END = 2**62
"""A slice end at least this large means "to the end" (Python's ``x[a:]`` passes maxsize)."""


def clip_symbolic(v: int | sympy.Expr, n: sympy.Expr) -> sympy.Expr:
    """``clip_index`` over symbolic sizes, where every admitted size decides it alike."""
    v = sympy.sympify(v)
    if v.is_Integer and int(v) >= _TO_THE_END:
        return n
    if not symbolic.provably(sympy.Ge(v, 0)):
        if not symbolic.provably(sympy.Gt(-v, 0)):
            raise StaticShapesOnly(f"slice bound {v} of a dim of size {n} has no fixed sign")
        v = v + n
        if not symbolic.provably(sympy.Ge(v, 0)):
            raise StaticShapesOnly(f"slice bound {v} may fall before the start of size {n}")
    if symbolic.provably(sympy.Ge(n - v, 0)):
        return v
    if symbolic.provably(sympy.Ge(v - n, 0)):
        return n
    if any(symbolic.is_unbacked(s) for s in (v - n).free_symbols):
        return sympy.Min(v, n)  # only the data decides (``x[:n]``, ``n = t.item()``)
    raise StaticShapesOnly(f"slice bound {v} may pass the end of size {n}")


def _slice_symbolic(x: TensorBox, dim: int, start: Any, end: Any, step: int) -> TensorBox:
    n = x.get_size()[dim]
    lo = clip_symbolic(start if start is not None else 0, n)
    hi = clip_symbolic(end if end is not None else n, n)
    if not symbolic.provably(sympy.Ge(hi - lo, 0)):
        raise StaticShapesOnly(f"slice [{lo}:{hi}] may be empty for some sizes")
    length = hi - lo if step == 1 else sizes.FloorDiv(hi - lo + step - 1, S(step))
    if (lo, length, step) == (0, n, 1):
        return x
    size = list(x.get_size())
    size[dim] = length

    def reindex(index: Index) -> list[sympy.Expr]:
        out = list(index)
        out[dim] = lo + out[dim] * step
        return out

    return _remap(x, size, reindex, "slice")


@register_lowering(*overloads("select", "int"))
def _select(x: TensorBox, dim: int, index: int) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    if symbolic.is_symbolic(x.get_size()[dim]):
        n_expr = x.get_size()[dim]
        pos_expr = index + n_expr if index < 0 else S(index)
        inside = sympy.Ge(pos_expr, 0) if index < 0 else sympy.Gt(n_expr - index, 0)
        if not symbolic.provably(inside):
            raise StaticShapesOnly(f"select {index} of a dim of size {n_expr}: not always inside")
        size = [s for i, s in enumerate(x.get_size()) if i != dim]
        return _remap(x, size, lambda idx: [*idx[:dim], pos_expr, *idx[dim:]], "select")
    n = sizes.evaluate_int(x.get_size()[dim])
    pos = index + n if index < 0 else index
    size = [s for i, s in enumerate(x.get_size()) if i != dim]
    return _remap(x, size, lambda idx: [*idx[:dim], S(pos), *idx[dim:]], "select")


@register_lowering(*overloads("flip", "default"))
def _flip(x: TensorBox, dims: Sequence[int]) -> TensorBox:
    flipped = {canonical_dim(d, x.dim()) for d in dims}
    size = x.get_size()

    def reindex(index: Index) -> list[sympy.Expr]:
        return [size[i] - 1 - v if i in flipped else v for i, v in enumerate(index)]

    return _remap(x, size, reindex, "flip")


@register_lowering(*overloads("roll", "default"))
def _roll(x: TensorBox, shifts: Sequence[int], dims: Sequence[int] = ()) -> TensorBox:
    if not dims:
        flat = flat_view(x)
        return view(_roll(flat, shifts, [0]), x.get_size())
    size = x.get_size()
    amounts = {canonical_dim(d, x.dim()): s for d, s in zip(dims, shifts, strict=True)}

    def reindex(index: Index) -> list[sympy.Expr]:
        out = list(index)
        for d, shift in amounts.items():
            n = sizes.evaluate_int(size[d])
            if n:
                out[d] = sizes.ModularIndexing(out[d] + (n - shift % n), 1, n)
        return out

    return _remap(x, size, reindex, "roll")


def _laid_out_like(layout: Layout, traced: torch.Tensor) -> bool:
    """Whether ``layout`` puts every element where ``traced`` (eager's tensor) has it."""
    return (
        tuple(sizes.static_int(n) for n in layout.size) == tuple(traced.shape)
        and sizes.static_int(layout.offset) == traced.storage_offset()
        and layout.strides_match(traced)
    )


@register_lowering(*overloads("as_strided", "default"))
def _as_strided(
    x: TensorBox, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> TensorBox:
    box = x.storage()
    if box is None:
        raise Unlowerable("as_strided of a computed view")
    buf = box.realize()
    traced = V.graph.layout_hint(x)
    if isinstance(traced, torch.Tensor) and not _laid_out_like(buf.layout, traced):
        # the strides address storage as eager laid it out: a buffer Kiln laid out otherwise
        # (NHWC in a channels-last graph) is read through a copy with eager's strides
        buf = copy_like(x, traced, "as_strided input")
    offset = S(storage_offset) if storage_offset is not None else buf.layout.offset
    lay = Layout(
        buf.layout.device,
        buf.layout.dtype,
        tuple(S(s) for s in size),
        tuple(S(s) for s in stride),
        offset,
    )
    return TensorBox(ReinterpretView(buf, lay))


@register_lowering(*overloads("split", "Tensor"))
def _split(x: TensorBox, split_size: int, dim: int = 0) -> list[TensorBox]:
    dim = canonical_dim(dim, x.dim())
    n = sizes.evaluate_int(x.get_size()[dim])
    if split_size == 0:
        return [x]
    return [slice_(x, dim, s, min(s + split_size, n)) for s in range(0, max(n, 1), split_size)]


@register_lowering(*overloads("split_with_sizes", "default"))
def _split_with_sizes(x: TensorBox, split_sizes: Sequence[int], dim: int = 0) -> list[TensorBox]:
    dim = canonical_dim(dim, x.dim())
    out, start = [], 0
    for size in split_sizes:
        out.append(slice_(x, dim, start, start + size))
        start += size
    return out


@register_lowering(*overloads("unbind", "int"))
def _unbind(x: TensorBox, dim: int = 0) -> list[TensorBox]:
    dim = canonical_dim(dim, x.dim())
    n = sizes.evaluate_int(x.get_size()[dim])
    return [_select(x, dim, i) for i in range(n)]


@register_lowering(*overloads("narrow", "default"))
def _narrow(x: TensorBox, dim: int, start: int, length: int) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    if start < 0:
        start += sizes.evaluate_int(x.get_size()[dim])
    return slice_(x, dim, start, start + length)


@register_lowering(*overloads("diagonal", "default"))
def _diagonal(x: TensorBox, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorBox:
    n = x.dim()
    d1, d2 = canonical_dim(dim1, n), canonical_dim(dim2, n)
    s1, s2 = (sizes.evaluate_int(x.get_size()[d]) for d in (d1, d2))
    length = max(0, min(s1, s2 - offset) if offset >= 0 else min(s1 + offset, s2))
    rest = [i for i in range(n) if i not in (d1, d2)]
    size = [x.get_size()[i] for i in rest] + [S(length)]

    def reindex(index: Index) -> list[sympy.Expr]:
        out: list[sympy.Expr] = [S(0)] * n
        for k, d in enumerate(rest):
            out[d] = index[k]
        diag = index[-1]
        out[d1] = diag + (0 if offset >= 0 else -offset)
        out[d2] = diag + (offset if offset >= 0 else 0)
        return out

    return _remap(x, size, reindex, "diagonal")
