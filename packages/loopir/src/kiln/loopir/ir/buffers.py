"""Buffers: named storage a kernel reads or writes.

``InputBuffer`` (graph inputs and constants), ``ComputedBuffer`` (a ``Loops``
stored by a kernel), ``ExternBuffer`` (an ATen call the wrapper makes: matmuls,
convolutions and fallbacks), ``MultiOutput`` (one tensor of an extern call's
result), ``MutationBuffer`` (a ``Scatter`` writing into another buffer's
storage) and ``SliceBuffer`` (a ``Pointwise`` filling a window of another
buffer's storage: one piece of a ``cat``). Buffers are mutable only in the fields passes decide later (layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir.errors import IRVerificationError
from kiln.loopir.ir.layout import Layout
from kiln.loopir.ir.loops import Loops, Reduction, Scatter
from kiln.loopir.virtualized import ops

__all__ = [
    "Buffer",
    "InputBuffer",
    "ComputedBuffer",
    "ExternBuffer",
    "MultiOutput",
    "MutationBuffer",
    "SliceBuffer",
]


@dataclasses.dataclass(eq=False)
class Buffer:
    """Named storage with a layout; loading it reads ``ops.load(name, layout.index(i))``."""

    name: str
    layout: Layout

    def get_name(self) -> str:
        return self.name

    def get_size(self) -> tuple[sympy.Expr, ...]:
        return self.layout.size

    def get_dtype(self) -> torch.dtype:
        return self.layout.dtype

    def get_device(self) -> torch.device:
        return self.layout.device

    def make_loader(self) -> Any:
        name, layout = self.name, self.layout

        def load(index: Sequence[sympy.Expr]) -> Any:
            return ops.load(name, layout.index(index))

        return load

    def storage_name(self) -> str:
        """The buffer whose storage this one uses (itself, except for mutations)."""
        return self.name

    def freeze_layout(self) -> None:
        self.layout = self.layout.as_fixed()

    def verify(self) -> None:
        self.layout.verify()

    def describe(self) -> str:
        return f"{self.name}: {type(self).__name__} {self.layout}"


@dataclasses.dataclass(eq=False)
class InputBuffer(Buffer):
    """A graph input (placeholder) or a constant the graph holds (``get_attr``)."""

    constant: torch.Tensor | None = None


@dataclasses.dataclass(eq=False)
class ComputedBuffer(Buffer):
    """A buffer a generated kernel fills from ``data``."""

    data: Loops = dataclasses.field(default=None)  # type: ignore[assignment]

    def verify(self) -> None:
        super().verify()
        self.data.verify()
        if tuple(self.data.get_size()) != tuple(self.layout.size):
            msg = f"{self.name}: computation size {self.data.get_size()} != layout {self.layout}"
            raise IRVerificationError(msg)

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def describe(self) -> str:
        kind = type(self.data).__name__
        return f"{self.name}: {kind} from {self.data.origin}, {self.layout}"


@dataclasses.dataclass(eq=False)
class MutationBuffer(ComputedBuffer):
    """A ``Scatter`` writing into ``target``'s storage (index_put, scatter, ...)."""

    target: str = ""

    def storage_name(self) -> str:
        return self.target

    def verify(self) -> None:
        if not isinstance(self.data, Scatter) or not self.target:
            msg = f"{self.name}: a mutation needs a Scatter and a target"
            raise IRVerificationError(msg)
        self.layout.verify()


@dataclasses.dataclass(eq=False)
class SliceBuffer(ComputedBuffer):
    """A ``Pointwise`` stored into a window of ``target``'s storage; ``layout`` is the
    window (``target``'s strides, offset to the piece). Unlike a mutation it fuses
    like any pointwise kernel, so a piece's producer can write it directly."""

    target: str = ""

    def storage_name(self) -> str:
        return self.target

    def make_loader(self) -> Any:
        name, layout = self.target, self.layout
        return lambda index: ops.load(name, layout.index(index))


@dataclasses.dataclass(eq=False)
class ExternBuffer(Buffer):
    """The result of calling ATen op ``op`` from the wrapper.

    ``args``/``kwargs`` hold buffers (passed as tensors), views of buffers
    (``ReinterpretView``, passed through ``as_strided``) and Python constants.
    ``fallback`` marks ops loopir has no lowering for (counted and logged).
    """

    op: Any = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    fallback: bool = False
    multi_output: bool = False

    def describe(self) -> str:
        kind = "Fallback" if self.fallback else "Extern"
        return f"{self.name}: {kind} {self.op}, {self.layout}"


@dataclasses.dataclass(eq=False)
class MultiOutput(Buffer):
    """The tensor at ``result[i][j]...`` (``index`` is ``(i, j, ...)``) of an extern call's result."""

    parent: ExternBuffer = dataclasses.field(default=None)  # type: ignore[assignment]
    index: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.name}: {self.parent.name}{list(self.index)}, {self.layout}"
