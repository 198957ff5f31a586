"""Decompositions run on IR: tensors that carry a ``TensorBox`` through ATen calls.

A decomposition from ``torch._decomp`` is ordinary Python over tensors. Running
it on :class:`IRTensor` s (a wrapper subclass holding IR, with metadata only)
sends every ATen call it makes back to the lowering graph, so ops without their
own lowering (softmax, layer_norm, gelu...) turn into the ops that have one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils import _pytree as pytree

from kiln.loopir import sizes
from kiln.loopir.ir.strided import as_strided_view
from kiln.loopir.ir.views import TensorBox

__all__ = ["IRTensor", "run_decomposition"]


class _Lowerer(Protocol):
    def lower(self, op: Any, args: Any, kwargs: Any, meta: Any) -> Any: ...
    def meta_of(self, op: Any, args: Any, kwargs: Any) -> Any: ...
    def add_constant(self, value: torch.Tensor) -> TensorBox: ...


class IRTensor(torch.Tensor):
    """Metadata of a tensor plus the IR that computes it; never holds data."""

    box: TensorBox
    lowerer: _Lowerer

    @staticmethod
    def __new__(cls, box: TensorBox, lowerer: _Lowerer) -> IRTensor:
        size = [sizes.evaluate_int(s) for s in box.get_size()]
        # real strides when the value is a window on a buffer, so decompositions that
        # read strides (or call as_strided) see the truth; contiguous otherwise
        found = as_strided_view(box)
        stride = None
        if found is not None and all(s.is_Integer for s in found.layout.stride):
            stride = [int(s) for s in found.layout.stride]
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            size,
            strides=stride,
            dtype=box.get_dtype(),
            device=box.get_device(),
            requires_grad=False,
        )
        r.box = box
        r.lowerer = lowerer
        return r  # type: ignore[no-any-return]

    def __repr__(self) -> str:  # type: ignore[override]
        return f"IRTensor({list(self.shape)}, {self.dtype})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        lowerer = next(
            x.lowerer for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, IRTensor)
        )

        def unwrap(x: Any) -> Any:
            if isinstance(x, IRTensor):
                return x.box
            if isinstance(x, torch.Tensor):
                return lowerer.add_constant(x)
            return x

        boxes, box_kwargs = pytree.tree_map(unwrap, (args, kwargs))
        meta = lowerer.meta_of(func, boxes, box_kwargs)
        result = lowerer.lower(func, boxes, box_kwargs, meta)
        return wrap(result, lowerer)


def wrap(value: Any, lowerer: _Lowerer) -> Any:
    return pytree.tree_map(lambda x: IRTensor(x, lowerer) if isinstance(x, TensorBox) else x, value)


def run_decomposition(
    lowerer: _Lowerer, decomposition: Callable[..., Any], args: Any, kwargs: Any
) -> Any:
    """Run ``decomposition`` on IR arguments; return IR results."""
    targs, tkwargs = wrap((args, kwargs), lowerer)
    out = decomposition(*targs, **tkwargs)
    return pytree.tree_map(lambda x: x.box if isinstance(x, IRTensor) else x, out)
