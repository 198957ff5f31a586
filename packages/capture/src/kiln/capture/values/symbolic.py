"""Numbers computed from symbolic sizes: ``x.shape[1]``, ``b * s``, ``h // 2 > 16``.

A :class:`SymValue` holds a ``torch.SymInt``, ``SymFloat`` or ``SymBool`` of the capture's
shape environment. Arithmetic, comparisons and torch ops keep it symbolic (torch_calls and
operators register those); everywhere else capture reads ``.value``, as it reads any
constant, and that read specializes it: the number the program runs with is fixed by a
guard (``L['x'].size()[1] == 7``). So a path capture does not know to be symbolic-safe
(a string format, a dict key, ``range(n)``) is sound by construction, at the price of a
recompile when the size changes.
"""

from __future__ import annotations

from typing import Any

import torch

from kiln.capture.values.base import ConstantValue

__all__ = ["SymSliceValue", "SymValue", "is_symbolic", "slice_value", "specialize"]

SymNumber = torch.SymInt | torch.SymFloat | torch.SymBool

_PYTHON_TYPES: dict[type, type] = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def is_symbolic(obj: Any) -> bool:
    """Whether ``obj`` is a torch symbolic number (not one that folded to a constant)."""
    return isinstance(obj, (torch.SymInt, torch.SymFloat, torch.SymBool))


def specialize(obj: Any) -> Any:
    """``obj`` as a plain Python number, guarding on its value; other objects as they are."""
    if isinstance(obj, torch.SymInt):
        return int(obj)
    if isinstance(obj, torch.SymFloat):
        return float(obj)
    if isinstance(obj, torch.SymBool):
        return bool(obj)
    return obj


class SymValue(ConstantValue):
    """A symbolic number: ``sym`` while it stays symbolic, ``value`` once a plain number is
    needed (reading it adds the guard that fixes it)."""

    def __init__(self, sym: SymNumber) -> None:
        self.sym = sym
        self.source = None

    @property  # type: ignore[override]
    def value(self) -> Any:
        return specialize(self.sym)

    def python_type(self) -> type:
        return _PYTHON_TYPES[type(self.sym)]

    def is_none(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"SymValue({self.sym.node.expr})"  # type: ignore[union-attr]


class SymSliceValue(ConstantValue):
    """A slice with a symbolic bound (``t[:, : s + 1]``): torch ops index with ``sym_slice``;
    anywhere else ``value`` is the slice of plain numbers (guarded, as ``SymValue.value``)."""

    def __init__(self, sym_slice: slice) -> None:
        self.sym_slice = sym_slice
        self.source = None

    @property  # type: ignore[override]
    def value(self) -> Any:
        s = self.sym_slice
        return slice(specialize(s.start), specialize(s.stop), specialize(s.step))

    def python_type(self) -> type:
        return slice


def slice_value(parts: list[ConstantValue]) -> ConstantValue:
    """The value of ``slice(*parts)``: symbolic where a bound is."""
    if any(isinstance(p, SymValue) for p in parts):
        return SymSliceValue(slice(*(p.sym if isinstance(p, SymValue) else p.value for p in parts)))
    return ConstantValue(slice(*(p.value for p in parts)))
