"""Ops loopir cannot lower, and the ones it hands to ATen on purpose (extern kernels).

The wrapper calls the ATen op on real tensors. Fallbacks are counted
(``fallback_ops``) and logged so missing lowerings show up; extern kernels
(``mm``, ``bmm``, ``addmm``, ``convolution``...) are the intended design: their
results feed the next generated kernel, where pointwise epilogues are inlined.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kiln.capture import counters
from kiln.loopir.ir.buffers import ExternBuffer, MultiOutput
from kiln.loopir.ir.layout import Layout, layout_of_tensor
from kiln.loopir.ir.strided import realize_as_tensor
from kiln.loopir.ir.views import StorageBox, TensorBox
from kiln.loopir.lowering.registry import overloads, register_lowering
from kiln.loopir.virtualized import V

__all__ = ["fallback", "extern_call", "EXTERN_OPS"]

log = logging.getLogger(__name__)
aten = torch.ops.aten

EXTERN_OPS: dict[str, tuple[str, ...]] = {
    "mm": ("default",),
    "bmm": ("default",),
    "addmm": ("default",),
    "baddbmm": ("default",),
    "convolution": ("default",),
    "_convolution": ("default",),
    "convolution_backward": ("default",),
    "_scaled_dot_product_flash_attention_for_cpu": ("default",),
    "sort": ("default", "stable"),
    "topk": ("default",),
    "native_group_norm": ("default",),
    "max_pool2d_with_indices": ("default",),
    "max_pool2d_with_indices_backward": ("default",),
    "avg_pool2d": ("default",),
    "avg_pool2d_backward": ("default",),
    "_adaptive_avg_pool2d": ("default",),
    "_adaptive_avg_pool2d_backward": ("default",),
    "upsample_nearest2d": ("default", "vec"),
    "upsample_bilinear2d": ("default", "vec"),
    "_cdist_forward": ("default",),
}
"""ATen ops (packet → overloads) the wrapper calls on purpose."""


def _layout(meta: torch.Tensor) -> Layout:
    layout = layout_of_tensor(meta)
    device = V.graph.device_of(meta)
    return Layout(device, layout.dtype, layout.size, layout.stride)


def extern_call(op: Any, args: Any, kwargs: Any, *, is_fallback: bool) -> Any:
    """An ``ExternBuffer`` calling ``op``; results as IR shaped like the op's."""
    meta = V.graph.current_meta

    def realize(x: Any) -> Any:
        if isinstance(x, TensorBox):
            return realize_as_tensor(x, f"input of {op}")
        return x

    rargs, rkwargs = pytree.tree_map(realize, (tuple(args), dict(kwargs)))
    single = isinstance(meta, torch.Tensor)
    # a multi-output call's own buffer is only a handle; its parts carry layouts
    handle = Layout(V.graph.default_device, torch.uint8, (), ())
    layout = _layout(meta) if single else handle
    buf = ExternBuffer(
        "", layout, op=op, args=rargs, kwargs=rkwargs, fallback=is_fallback, multi_output=not single
    )
    V.graph.register_buffer(buf)
    if single:
        return TensorBox(StorageBox(buf))

    leaves, spec = pytree.tree_flatten(meta)
    outs: list[Any] = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            outs.append(leaf)
            continue
        part = MultiOutput("", _layout(leaf), parent=buf, index=(i,))
        V.graph.register_buffer(part)
        outs.append(TensorBox(StorageBox(part)))
    return pytree.tree_unflatten(outs, spec)


def fallback(op: Any, args: Any, kwargs: Any) -> Any:
    """Call ``op`` from the wrapper because loopir has no lowering for it."""
    name = str(op)
    counters.bump("fallback_ops", name)
    log.info("no lowering for %s: calling the ATen op from the wrapper", name)
    return extern_call(op, args, kwargs, is_fallback=True)


def _extern(*args: Any, **kwargs: Any) -> Any:
    return extern_call(V.graph.current_op, args, kwargs, is_fallback=False)


register_lowering(*[op for n, ovls in EXTERN_OPS.items() for op in overloads(n, *ovls)])(_extern)
