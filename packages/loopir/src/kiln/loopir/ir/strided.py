"""Turning views into strided windows, for consumers that need real tensors.

Extern kernels, fallbacks and graph outputs need a tensor, not an index
function. When a view's index into its buffer is affine (permute, slice,
expand, select...), it becomes a ``ReinterpretView`` with the strides read off
the expression; otherwise the values are copied into a fresh buffer.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree

from kiln.loopir import sizes
from kiln.loopir.ir.buffers import Buffer
from kiln.loopir.ir.layout import Layout, is_dense
from kiln.loopir.ir.loops import Pointwise
from kiln.loopir.ir.views import ReinterpretView, StorageBox, TensorBox, View, pointwise_copy
from kiln.loopir.virtualized import V

__all__ = [
    "affine_layout",
    "as_strided_view",
    "channels_last_io",
    "copy_like",
    "realize_as_tensor",
    "realize_like",
    "stored_hint",
]


def _base_and_index(node: Any, index: list[sympy.Expr]) -> tuple[Buffer, sympy.Expr] | None:
    """Walk views down to a buffer, mapping ``index`` into its storage position."""
    while True:
        if isinstance(node, View):
            index = list(node.reindex(index))
            node = node.data
        elif isinstance(node, ReinterpretView):
            return node.buffer, node.layout.index(index)
        elif isinstance(node, StorageBox):
            if not isinstance(node.data, Buffer):
                return None
            node = node.data
        elif isinstance(node, Buffer):
            return node, node.layout.index(index)
        else:
            return None


def affine_layout(
    expr: sympy.Expr, symbols: list[sympy.Symbol], template: Layout, size: tuple[sympy.Expr, ...]
) -> Layout | None:
    """The strided layout with position ``expr``, or None when ``expr`` is not affine."""
    found = sizes.affine_strides(expr, symbols)
    if found is None:
        return None
    offset, steps = found
    strides = [sympy.S.Zero if n == 1 else s for n, s in zip(size, steps, strict=True)]
    if any(s.is_negative for s in strides):
        return None  # torch has no negative strides (flip is a copy there)
    return Layout(template.device, template.dtype, size, tuple(strides), offset)


def as_strided_view(x: TensorBox) -> Buffer | ReinterpretView | None:
    """``x`` as a buffer or strided window on one, when its storage is realized."""
    data = x.data
    if isinstance(data, StorageBox) and isinstance(data.data, Buffer):
        return data.data
    if isinstance(data, (Buffer, ReinterpretView)):
        return data
    size = x.get_size()
    symbols = [sizes.index_symbol("v", i) for i in range(len(size))]
    found = _base_and_index(data, list(symbols))
    if found is None:
        return None
    buf, expr = found
    # reshapes of strided windows index through FloorDiv/ModularIndexing digits that the
    # ranges make affine again (a view of a transposed tensor); the static ranges alone do
    # for a flattened symbolic dim, ``(s0, s1, 16)`` viewed as ``(s0*s1, 16)``
    static = ((sym, sizes.static_int(n)) for sym, n in zip(symbols, size, strict=True))
    expr = sizes.simplify_with_ranges(expr, {sym: n for sym, n in static if n is not None})
    layout = affine_layout(expr, symbols, buf.layout, size)
    return ReinterpretView(buf, layout) if layout is not None else None


def realize_as_tensor(x: TensorBox, origin: str) -> Buffer | ReinterpretView:
    """``x`` as something the wrapper can pass as a tensor, copying only if needed."""
    box = x.storage()
    if box is not None:
        box.realize()
    found = as_strided_view(x)
    if found is not None:
        return found
    copy = pointwise_copy(x, origin)
    storage = copy.storage()
    assert storage is not None
    return storage.realize()


def realize_like(x: TensorBox, traced: Any) -> None:
    """Realize ``x``, a pointwise value not yet stored, with the strides eager gave it.

    ``traced`` is the value's meta tensor. Kernels such as attention lay out their
    result like their inputs, and later graphs (a backward reading saved tensors)
    expect the traced strides, so a value stored contiguously where eager's was not
    would cost a copy later. Does nothing for views, buffers, or non-dense metas.
    """
    box = x.data
    if not (isinstance(box, StorageBox) and isinstance(box.data, Pointwise)):
        return
    if not isinstance(traced, torch.Tensor) or not is_dense(traced):
        return
    if V.graph.channels_last and traced.dim() == 4:
        return  # the graph keeps 4-D buffers NHWC, whatever eager chose
    if tuple(traced.shape) != tuple(sizes.static_int(n) for n in x.get_size()):
        return
    box.realize(traced.stride())


def stored_hint(traced: Any) -> Any:
    """``traced`` (eager's value of a node), or an NCHW meta like it where the graph stores
    eager's NHWC values NCHW (``GraphLowering.stores_nchw``): what ``realize_like`` gets."""
    if not (V.graph.stores_nchw and isinstance(traced, torch.Tensor) and traced.dim() == 4):
        return traced
    if traced.is_contiguous() or not traced.is_contiguous(memory_format=torch.channels_last):
        return traced
    if not all(isinstance(n, int) for n in traced.shape):
        return traced
    return torch.empty(traced.shape, dtype=traced.dtype, device="meta")


def copy_like(x: TensorBox, traced: torch.Tensor, origin: str) -> Buffer:
    """A new buffer holding ``x``'s values with ``traced``'s (eager's) strides."""
    copy = pointwise_copy(x, origin).storage()
    assert copy is not None
    return copy.realize(traced.stride())


def channels_last_io(gm: torch.fx.GraphModule) -> bool:
    """Whether a 4-D input or returned value of ``gm`` is traced channels-last."""
    metas: list[Any] = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            metas.append(n.meta.get("val"))
        elif n.op == "output":
            metas.append(torch.fx.map_arg(n.args[0], lambda a: a.meta.get("val")))
    return any(
        isinstance(t, torch.Tensor)
        and t.dim() == 4
        and t.is_contiguous(memory_format=torch.channels_last)
        and not t.is_contiguous()
        for t in pytree.tree_leaves(metas)
    )
