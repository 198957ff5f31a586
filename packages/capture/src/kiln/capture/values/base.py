"""The root of tracked values, and Python constants.

The symbolic stack and locals hold :class:`Value` objects. A value that came
from the frame knows its :class:`~kiln.capture.source.Source`, so emitted code
can reload it and guards can check it; values made during tracing have none.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.source import Source

__all__ = [
    "CONSTANT_TYPES",
    "NULL",
    "ConstantValue",
    "NullValue",
    "Value",
    "callable_and_args",
    "is_constant",
]

CONSTANT_TYPES: tuple[type, ...] = (
    int,
    float,
    bool,
    str,
    bytes,
    complex,
    type(None),
    type(Ellipsis),
    type(NotImplemented),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    torch.Size,
    range,
    slice,
    types.CodeType,
)


# the constant types whose every instance is constant, by exact type: most answers, no walk
_PLAIN_CONSTANTS = frozenset(CONSTANT_TYPES) - {torch.Size, slice}


def is_constant(obj: Any) -> bool:
    """Whether ``obj`` is an immutable value capture may fold and bake into graphs."""
    if type(obj) in _PLAIN_CONSTANTS:
        return True
    if isinstance(obj, (tuple, frozenset)) and type(obj) in (tuple, frozenset):
        return all(is_constant(x) for x in obj)
    if isinstance(obj, slice):
        return all(is_constant(x) for x in (obj.start, obj.stop, obj.step))
    if isinstance(obj, torch.Size):  # symbolic sizes are not known values
        return not any(isinstance(n, torch.SymInt) for n in obj)
    return isinstance(obj, CONSTANT_TYPES)


class Value:
    """A value on the symbolic stack: what capture knows of one Python object."""

    source: Source | None = None

    def python_type(self) -> type:
        """The type the real object has (or will have) at run time."""
        raise NotImplementedError

    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        """The Python value, for values that are compile-time constants."""
        raise unsupported("unsupported_value", f"{type(self).__name__} is not a constant")

    def __repr__(self) -> str:
        where = f" from {self.source}" if self.source is not None else ""
        return f"{type(self).__name__}({self.python_type().__name__}{where})"


class ConstantValue(Value):
    """An immutable Python value known at capture time (guarded when it has a source)."""

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def is_none(self) -> bool:
        """Whether the value is None (asked without reading a symbolic number's value)."""
        return self.value is None

    def __repr__(self) -> str:
        return f"ConstantValue({self.value!r})"


class NullValue(Value):
    """The NULL the calling convention pushes beside a callable (below it before 3.13,
    above it from 3.13 on) where there is no ``self``."""

    def python_type(self) -> type:
        return type(None)


NULL = NullValue()


def callable_and_args(first: Value, second: Value, args: list[Value]) -> tuple[Value, list[Value]]:
    """The callable and arguments of a call's stack ``first, second, *args``.

    One of ``first``/``second`` is NULL (below the callable before 3.13, above it
    from 3.13 on), or they are a method and its ``self``.
    """
    if isinstance(first, NullValue):
        return second, args
    if isinstance(second, NullValue):
        return first, args
    return first, [second, *args]
