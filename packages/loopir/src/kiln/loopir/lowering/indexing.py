"""Lowerings that move data by index: cat, pad, gather, index, index_put, scatter, embedding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import StaticShapesOnly, Unlowerable
from kiln.loopir.ir.buffers import Buffer, MutationBuffer, SliceBuffer
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.loops import Pointwise, Scatter
from kiln.loopir.ir.views import StorageBox, TensorBox, pointwise_copy
from kiln.loopir.lowering.common import (
    broadcast_sizes,
    canonical_dim,
    expand_to,
    origin,
    out_dtype,
)
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.virtualized import V, ops

__all__: list[str] = []

S = sympy.Integer
Index = Sequence[sympy.Expr]

MAX_POINTWISE_CAT_INPUTS = 8
"""A ``cat`` of more inputs is stored piece by piece into one buffer: as one
pointwise loop, every element would test every piece's range. Where the backend's traits say
``pointwise_cat=False`` a ``cat`` that gets stored is stored so too (C++: a vector lane
computes each piece's load, the masked ones too, so a stored ``cat`` of a few large
pieces costs a multiple of their copy); inlined into a pointwise consumer (a batch norm
over concatenated features), it stays one loop and is never stored."""


def _in_range(expr: sympy.Expr, lo: Any, hi: Any) -> Any:
    pos = ops.index_expr(expr, torch.int64)
    return ops.logical_and(ops.ge(pos, _bound(lo)), ops.lt(pos, _bound(hi)))


def _bound(value: Any) -> Any:
    """An int, or a symbolic size (this call's value)."""
    if isinstance(value, sympy.Basic) and symbolic.is_symbolic(value):
        return ops.index_expr(value, torch.int64)
    return ops.constant(value, torch.int64)


def _converted_loader(x: TensorBox, dtype: torch.dtype) -> Any:
    load, src = x.make_loader(), x.get_dtype()
    if src == dtype:
        return load
    return lambda idx: ops.to_dtype(load(idx), dtype, src)


def _bind(load: Any, index: list[sympy.Expr]) -> Callable[[], Any]:
    return lambda: load(index)


def _cat_length(n: sympy.Expr) -> Any:
    """An input's length along the ``cat`` dim: an int, or a symbolic size that is never 0
    (an empty piece is dropped, so whether it is must not depend on the call), or one
    computed from data (``x[mask]``), kept whatever its length: an empty piece's masked loads
    never run, and its window copy is a loop of no iterations."""
    if not symbolic.is_symbolic(n):
        return sizes.evaluate_int(n)
    unbacked = any(symbolic.is_unbacked(s) for s in n.free_symbols)
    if not unbacked and not symbolic.provably(sympy.Gt(n, 0)):
        raise StaticShapesOnly(f"cat input of length {n} may be empty")
    return n


@register_lowering(*overloads("cat", "default"))
def _cat(tensors: Sequence[TensorBox], dim: int = 0) -> TensorBox:
    parts = [t for t in tensors if not (t.dim() == 1 and t.get_size()[0] == 0)]
    if not parts:
        parts = list(tensors[:1])
    ndim = parts[0].dim()
    dim = canonical_dim(dim, ndim)
    result = out_dtype()
    pieces: list[tuple[int, int, Any]] = []
    offset = 0
    for t in parts:
        n = _cat_length(t.get_size()[dim])
        pieces.append((offset, offset + n, _converted_loader(t, result)))
        offset += n
    size = list(parts[0].get_size())
    size[dim] = sympy.sympify(offset)
    device = parts[0].get_device()

    def into_slices(layout: Layout) -> Buffer:
        return _cat_into_slices(parts, pieces, dim, layout)

    if len(pieces) > MAX_POINTWISE_CAT_INPUTS and offset:
        layout = V.graph.new_layout(device, result, tuple(size)).as_fixed()
        return TensorBox(StorageBox(into_slices(layout)))

    live = [p for p in pieces if bool(p[1] != p[0])] or pieces[:1]  # empty pieces give no element

    def inner(index: Index) -> Any:
        if len(live) == 1:
            lo, _, load = live[0]
            return load([e - lo if i == dim else e for i, e in enumerate(index)])
        # Every piece's load is masked to its range, the last one's too: a kernel loads every
        # lane the mask leaves on, and the ``where`` that discards the other lanes comes after
        # the load (shifted back by ``lo``, they read before the piece's first element).
        value = None
        for lo, hi, load in reversed(live):
            shifted = [e - lo if i == dim else e for i, e in enumerate(index)]
            mask = _in_range(index[dim], lo, hi)
            part = ops.masked(mask, _bind(load, shifted), 0)
            value = part if value is None else ops.where(mask, part, value)
        return value

    box = StorageBox(Pointwise(device, result, tuple(size), origin(), inner))
    # Split into slices, a result with no element would be a buffer no kernel writes (and so
    # none allocates); as one loop of no iterations it is allocated and left as it is.
    if offset and not V.graph.backend_traits(device).pointwise_cat:
        box.split = into_slices  # once stored; inlined into consumers it stays one loop
    return TensorBox(box)


def _cat_into_slices(
    parts: Sequence[TensorBox], pieces: Sequence[tuple[int, int, Any]], dim: int, layout: Layout
) -> Buffer:
    """Each input copied into its window of a buffer of ``layout`` (Inductor's
    ``ConcatKernel``); a copy fuses into the kernel that produces its input."""
    device, dtype = layout.device, layout.dtype
    layout = layout.as_fixed()
    target = Buffer("", layout)
    name = V.graph.register_storage(target)
    for t, (lo, hi, load) in zip(parts, pieces, strict=True):
        if hi == lo:
            continue
        piece_size = tuple(t.get_size())
        window = Layout(
            device, dtype, piece_size, layout.stride, layout.offset + lo * layout.stride[dim]
        )
        copy = Pointwise(device, dtype, piece_size, origin(), load)
        V.graph.register_buffer(SliceBuffer("", window, data=copy, target=name))
    return target


@register_lowering(*overloads("constant_pad_nd", "default"))
def _constant_pad_nd(x: TensorBox, pad: Sequence[int | sympy.Expr], value: float = 0) -> TensorBox:
    ndim = x.dim()
    size = list(x.get_size())
    lows: dict[int, int | sympy.Expr] = {}
    grown: list[int] = []  # dims that may gain positions outside the input: those need a mask
    for k in range(len(pad) // 2):
        d = ndim - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        lows[d] = lo
        size[d] = size[d] + lo + hi
        # a pad of unknown sign is masked: where it crops, the mask is always true
        if not (_never_positive(lo) and _never_positive(hi)):
            grown.append(d)
    load = x.make_loader()
    old = [sizes.static_int(s) if sizes.static_int(s) is not None else s for s in x.get_size()]
    dtype = x.get_dtype()

    def inner(index: Index) -> Any:
        src = [e - lows.get(i, 0) for i, e in enumerate(index)]
        masks = [_in_range(src[d], 0, old[d]) for d in grown]
        if not masks:
            return load(src)
        mask = masks[0]
        for m in masks[1:]:
            mask = ops.logical_and(mask, m)
        return ops.masked(mask, lambda: load(src), value)

    return TensorBox.from_loops(Pointwise(x.get_device(), dtype, tuple(size), origin(), inner))


def _never_positive(amount: int | sympy.Expr) -> bool:
    """Whether a pad amount is at most 0 in every call the guards admit."""
    if isinstance(amount, int):
        return amount <= 0
    return symbolic.provably(sympy.Ge(0, amount))


def _indirect(index_load: Any, idx: Index, dim_size: sympy.Expr) -> sympy.Expr:
    return ops.indirect_indexing(index_load(idx), dim_size)


@register_lowering(*overloads("gather", "default"))
def _gather(x: TensorBox, dim: int, index: TensorBox, sparse_grad: bool = False) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    load, load_index = x.make_loader(), index.make_loader()
    dim_size = x.get_size()[dim] if x.dim() else S(1)

    def inner(idx: Index) -> Any:
        pos = _indirect(load_index, idx, dim_size)
        return load([pos if i == dim else e for i, e in enumerate(idx)])

    return TensorBox.from_loops(
        Pointwise(x.get_device(), x.get_dtype(), index.get_size(), origin(), inner)
    )


def _index_plan(x: TensorBox, indices: Sequence[TensorBox | None]) -> tuple[list[sympy.Expr], Any]:
    """Result size of ``x[indices]`` and a function from result index to ``x``'s index."""
    if any(i is not None and i.get_dtype() in (torch.bool, torch.uint8) for i in indices):
        raise Unlowerable("boolean-mask indexing has a data-dependent size")
    indices = list(indices) + [None] * (x.dim() - len(indices))
    used = [d for d, i in enumerate(indices) if i is not None]
    tensors = [i for i in indices if i is not None]
    bshape = list(broadcast_sizes(*(t.get_size() for t in tensors)))
    loaders = [expand_to(t, bshape).make_loader() for t in tensors]
    adjacent = used == list(range(used[0], used[-1] + 1))
    first = used[0] if adjacent else 0
    rest = [d for d in range(x.dim()) if d not in used]
    before = [d for d in rest if d < first] if adjacent else []
    after = [d for d in rest if d not in before]
    xs = x.get_size()
    out_size = [xs[d] for d in before] + bshape + [xs[d] for d in after]
    nb = len(bshape)

    def to_source(idx: Index) -> list[sympy.Expr]:
        src: list[sympy.Expr] = [S(0)] * x.dim()
        for k, d in enumerate(before):
            src[d] = idx[k]
        bidx = idx[len(before) : len(before) + nb]
        for d, load in zip(used, loaders, strict=True):
            src[d] = ops.indirect_indexing(load(bidx), xs[d])
        for k, d in enumerate(after):
            src[d] = idx[len(before) + nb + k]
        return src

    return out_size, to_source


@register_lowering(*overloads("index", "Tensor"), *overloads("_unsafe_index", "Tensor"))
def _index(x: TensorBox, indices: Sequence[TensorBox | None]) -> TensorBox:
    size, to_source = _index_plan(x, indices)
    load = x.make_loader()
    return TensorBox.from_loops(
        Pointwise(
            x.get_device(), x.get_dtype(), tuple(size), origin(), lambda i: load(to_source(i))
        )
    )


@register_lowering(*overloads("index_select", "default"))
def _index_select(x: TensorBox, dim: int, index: TensorBox) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    return _index(x, [None] * dim + [index])


@register_lowering(*overloads("embedding", "default"))
def _embedding(weight: TensorBox, indices: TensorBox, *args: Any, **kwargs: Any) -> TensorBox:
    return _index(weight, [indices])


def _mutable_copy(x: TensorBox) -> str:
    """A fresh realized copy of ``x`` that a scatter may write into; its name."""
    copy = pointwise_copy(x, "copy for scatter")
    box = copy.data
    assert isinstance(box, StorageBox)
    return box.realize().name


def _scatter_into(
    x: TensorBox, source_size: Sequence[sympy.Expr], value: Any, target_index: Any, mode: str | None
) -> TensorBox:
    """``x`` copied, then ``value(i)`` written at ``target_index(i)`` for each source ``i``."""
    name = _mutable_copy(x)
    target = V.graph.name_to_buffer[name]
    scatter = Scatter(
        x.get_device(), x.get_dtype(), tuple(source_size), origin(), value, target_index, mode
    )
    V.graph.register_buffer(MutationBuffer("", target.layout, data=scatter, target=name))
    return TensorBox(StorageBox(target))


@register_lowering(*overloads("index_put", "default"), *overloads("_unsafe_index_put", "default"))
def _index_put(
    x: TensorBox, indices: Sequence[TensorBox | None], values: TensorBox, accumulate: bool = False
) -> TensorBox:
    size, to_source = _index_plan(x, indices)
    load = _converted_loader(expand_to(values, size), x.get_dtype())
    mode = "atomic_add" if accumulate else None
    return _scatter_into(x, size, load, to_source, mode)


def _scatter_common(
    x: TensorBox, dim: int, index: TensorBox, src: Any, mode: str | None
) -> TensorBox:
    dim = canonical_dim(dim, x.dim())
    load_index = index.make_loader()
    dim_size = x.get_size()[dim] if x.dim() else S(1)
    if isinstance(src, TensorBox):
        value = _converted_loader(src, x.get_dtype())
    else:
        dtype = x.get_dtype()
        value = lambda idx: ops.constant(src, dtype)  # noqa: E731

    def target(idx: Index) -> list[sympy.Expr]:
        pos = ops.indirect_indexing(load_index(idx), dim_size)
        return [pos if i == dim else e for i, e in enumerate(idx)]

    return _scatter_into(x, index.get_size(), value, target, mode)


@register_lowering(*overloads("scatter", "src", "value"))
def _scatter(x: TensorBox, dim: int, index: TensorBox, src: Any) -> TensorBox:
    return _scatter_common(x, dim, index, src, None)


@register_lowering(*overloads("scatter_add", "default"))
def _scatter_add(x: TensorBox, dim: int, index: TensorBox, src: TensorBox) -> TensorBox:
    return _scatter_common(x, dim, index, src, "atomic_add")
