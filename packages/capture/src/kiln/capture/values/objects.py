"""Real Python objects (modules, classes, builtins, user instances) and objects made in the trace."""

from __future__ import annotations

from typing import Any

from kiln.capture.source import Source
from kiln.capture.values.base import Value

__all__ = ["NewObjectValue", "ObjectValue", "SuperValue"]


class ObjectValue(Value):
    """A real object that exists outside the capture; read, never mutated.

    ``private`` marks a real object the trace itself created (a deep copy of a
    frame object) and nothing else can reach: the trace may set its attributes.
    """

    def __init__(self, obj: Any, source: Source | None = None, private: bool = False) -> None:
        self.obj = obj
        self.source = source
        self.private = private

    def python_type(self) -> type:
        return type(self.obj)

    def __repr__(self) -> str:
        where = f" from {self.source}" if self.source is not None else ""
        return f"ObjectValue({type(self.obj).__name__}{where})"


class NewObjectValue(Value):
    """An instance of a user class created while tracing; its attributes are tracked."""

    def __init__(self, cls: type, attrs: dict[str, Value] | None = None) -> None:
        self.cls = cls
        self.attrs = attrs if attrs is not None else {}

    def python_type(self) -> type:
        return self.cls


class SuperValue(Value):
    """``super(cls, obj)``: attribute lookups start after ``cls`` in ``obj``'s MRO."""

    def __init__(self, cls: type, obj: Value) -> None:
        self.cls = cls
        self.obj = obj

    def python_type(self) -> type:
        return super
