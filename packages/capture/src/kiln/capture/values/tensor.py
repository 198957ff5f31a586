"""Tensors on the symbolic stack: an fx node plus a fake tensor with the same metadata."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.source import Source
from kiln.capture.values.base import Value

__all__ = ["DispatchResult", "TensorValue", "TensorMethodValue"]


class DispatchResult:
    """The ``real_type`` of a tensor an op computed from a ``__torch_dispatch__`` wrapper:
    its class is whatever the wrapper's dispatch returns, which the trace does not run."""


class TensorValue(Value):
    """A tensor: the graph node computing it and its fake value (``node.meta['val']``)."""

    def __init__(
        self,
        node: fx.Node,
        fake: torch.Tensor,
        source: Source | None = None,
        real_type: type = torch.Tensor,
    ) -> None:
        self.node = node
        self.fake = fake
        self.source = source
        self.real_type = real_type

    def python_type(self) -> type:
        if self.real_type is DispatchResult:  # guessing would take a branch eager may not
            raise unsupported(
                "unsupported_value",
                "the type of a tensor computed by a __torch_dispatch__ subclass",
            )
        return self.real_type

    def __repr__(self) -> str:
        return f"TensorValue({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"


class TensorMethodValue(Value):
    """``tensor.name`` for a method name: calling it adds a ``call_method`` node."""

    def __init__(self, tensor: TensorValue, name: str) -> None:
        self.tensor = tensor
        self.name = name

    def python_type(self) -> type:
        return type(getattr(torch.Tensor, self.name))

    @property
    def receiver(self) -> TensorValue:
        """The tensor the method is bound to (``__self__``), as a builtin method's receiver."""
        return self.tensor

    def method(self) -> Any:
        return getattr(torch.Tensor, self.name)
