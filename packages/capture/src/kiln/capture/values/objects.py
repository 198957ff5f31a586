"""Real Python objects (modules, classes, builtins, user instances) and objects made in the trace."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, MutableMapping
from typing import Any, cast

from kiln.capture.source import Source
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import DictValue

__all__ = ["InstanceDictValue", "NewObjectValue", "ObjectValue", "SuperValue", "WeakRefValue"]


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


class WeakRefValue(Value):
    """``weakref.ref(obj)`` made in the trace: calling it gives ``obj``.

    The trace holds ``obj`` while it runs, so the referent is alive at every call the trace
    makes (eager's weakref could die only once nothing else holds ``obj``; code that checks
    for that then rebuilds what it lost, which the trace never needs to).
    """

    def __init__(self, target: Value) -> None:
        self.target = target

    def python_type(self) -> type:
        return weakref.ref


class SuperValue(Value):
    """``super(cls, obj)``: attribute lookups start after ``cls`` in ``obj``'s MRO."""

    def __init__(self, cls: type, obj: Value) -> None:
        self.cls = cls
        self.obj = obj

    def python_type(self) -> type:
        return super


class _AttrItems(MutableMapping[Any, tuple[Value, Value]]):
    """An instance's attributes as a tracked dict's ``items`` (key -> (key, value)), live."""

    def __init__(self, owner: NewObjectValue) -> None:
        self.owner = owner

    def __getitem__(self, key: Any) -> tuple[Value, Value]:
        return ConstantValue(key), self.owner.attrs[key]

    def __setitem__(self, key: Any, pair: tuple[Value, Value]) -> None:
        self.owner.attrs[key] = pair[1]

    def __delitem__(self, key: Any) -> None:
        del self.owner.attrs[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.owner.attrs)

    def __len__(self) -> int:
        return len(self.owner.attrs)


class InstanceDictValue(DictValue):
    """``obj.__dict__`` (``vars(obj)``) of an instance made in the trace: the same attributes,
    so a store through either is seen by the other, as in Python."""

    def __init__(self, owner: NewObjectValue) -> None:
        super().__init__({}, dict)
        self.owner = owner

    @property  # type: ignore[override]
    def items(self) -> dict[Any, tuple[Value, Value]]:
        return cast("dict[Any, tuple[Value, Value]]", _AttrItems(self.owner))

    @items.setter
    def items(self, value: dict[Any, tuple[Value, Value]]) -> None:
        if hasattr(self, "owner"):  # a rollback restores the attributes themselves
            self.owner.attrs = {k: v for k, (_, v) in value.items()}
