"""Python functions, bound methods and ``functools.partial`` objects, all inlined when called."""

from __future__ import annotations

import functools
import types
from typing import Any

from kiln.capture.source import Source
from kiln.capture.values.base import Value
from kiln.capture.values.containers import CellValue

__all__ = [
    "BoundMethodValue",
    "BuiltinMethodValue",
    "PartialValue",
    "ReplayedCallValue",
    "UserFunctionValue",
]


class UserFunctionValue(Value):
    """A Python function: a real one from the frame, or one made by MAKE_FUNCTION.

    ``globals_source`` is the source of the function's globals dict (None: the
    captured frame's own globals, reached through ``G[...]``).
    """

    def __init__(
        self,
        code: types.CodeType,
        f_globals: dict[str, Any],
        *,
        name: str,
        defaults: tuple[Value, ...] = (),
        kwdefaults: dict[str, Value] | None = None,
        closure: tuple[CellValue, ...] = (),
        real: types.FunctionType | None = None,
        source: Source | None = None,
        globals_source: Source | None = None,
    ) -> None:
        self.code = code
        self.f_globals = f_globals
        self.name = name
        self.defaults = defaults
        self.kwdefaults = kwdefaults or {}
        self.closure = closure
        self.real = real
        self.source = source
        self.globals_source = globals_source

    def python_type(self) -> type:
        return types.FunctionType

    def __repr__(self) -> str:
        return f"UserFunctionValue({self.code.co_qualname})"


class BoundMethodValue(Value):
    """``obj.method`` for a Python method: calling it calls ``func(obj, ...)``."""

    def __init__(self, func: Value, self_value: Value, source: Source | None = None) -> None:
        self.func = func
        self.self_value = self_value
        self.source = source

    def python_type(self) -> type:
        return types.MethodType


class PartialValue(Value):
    """``functools.partial(func, *args, **kwargs)``."""

    def __init__(self, func: Value, args: list[Value], kwargs: dict[str, Value]) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs

    def python_type(self) -> type:
        return functools.partial


class ReplayedCallValue(Value):
    """A real callable whose calls are effects to replay (logging, ``warnings.warn``, ``print``).

    ``located``: ``fn`` takes the calling user frame's (file, line, function) first.
    """

    def __init__(self, fn: Any, located: bool = False) -> None:
        self.fn = fn
        self.located = located

    def python_type(self) -> type:
        return type(self.fn)


class BuiltinMethodValue(Value):
    """A builtin method of a tracked container (``lst.append``, ``d.items``)."""

    def __init__(self, receiver: Value, name: str) -> None:
        self.receiver = receiver
        self.name = name

    def python_type(self) -> type:
        return types.BuiltinMethodType
