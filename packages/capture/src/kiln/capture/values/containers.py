"""Lists, tuples, dicts, sets and cells whose items are tracked values.

A container made during tracing may be mutated freely: it exists only in the
capture. One that came from the frame has a source; mutating it marks it, and
the emitted code writes its final contents back after the graph runs.
"""

from __future__ import annotations

from typing import Any

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.source import Source
from kiln.capture.values.base import ConstantValue, Value

__all__ = [
    "CellValue",
    "DictValue",
    "DictViewValue",
    "ListValue",
    "SetValue",
    "TupleValue",
    "dict_key",
]


class _Mutable(Value):
    # instance attributes of a subclass instance made in the trace (``self.extra = 1`` in its
    # ``__init__``); every kind's constructor sets its own dict
    attrs: dict[str, Value]
    mutated = False
    # a copy of a real container Kiln has no way to reach again (no source): read-only
    detached = False

    def check_mutable(self) -> None:
        """Note a mutation; a container from the frame is written back by the emitted code."""
        if self.detached:
            raise unsupported("side_effect", "mutating a container Kiln cannot write back")
        if self.source is not None:
            self.mutated = True


class TupleValue(Value):
    """A tuple, or a namedtuple / ``torch.Size``-like tuple subclass given by ``cls``."""

    def __init__(self, items: list[Value], cls: type = tuple, source: Source | None = None):
        self.items = items
        self.cls = cls
        self.source = source

    def python_type(self) -> type:
        return self.cls


class ListValue(_Mutable):
    """A list."""

    def __init__(self, items: list[Value], source: Source | None = None, cls: type = list):
        self.items = items
        self.source = source
        self.cls = cls
        self.attrs = {}

    def python_type(self) -> type:
        return self.cls


def dict_key(key: Value) -> Any:
    """The hashable Python object that stands for ``key`` inside a tracked dict.

    A tensor hashes by identity, so it stands as its fake: in-place ops keep the fake.
    """
    if isinstance(key, ConstantValue):
        return key.value
    fake = getattr(key, "fake", None)
    if fake is not None:
        return fake
    obj = getattr(key, "obj", None)
    if obj is not None:
        try:
            hash(obj)
        except TypeError:
            pass
        else:
            return obj
    raise unsupported("unsupported_value", f"dict key {key}")


class DictValue(_Mutable):
    """A dict or dict subclass (OrderedDict, ModelOutput); ``items`` maps key -> (key, value)."""

    def __init__(
        self,
        items: dict[Any, tuple[Value, Value]],
        cls: type = dict,
        source: Source | None = None,
    ):
        self.items = items
        self.cls = cls
        self.source = source
        self.attrs = {}

    def python_type(self) -> type:
        return self.cls

    def get(self, key: Value) -> Value | None:
        found = self.items.get(dict_key(key))
        return found[1] if found is not None else None

    def set(self, key: Value, value: Value) -> None:
        self.check_mutable()
        self.items[dict_key(key)] = (key, value)


class DictViewValue(Value):
    """``d.keys()``, ``d.values()`` or ``d.items()``: a live view, reading ``d`` when used."""

    def __init__(self, d: DictValue, kind: str) -> None:
        self.dict = d
        self.kind = kind

    def python_type(self) -> type:
        return type(getattr({}, self.kind)())

    @property
    def items(self) -> list[Value]:
        """The view's elements as the dict holds them now."""
        pairs = self.dict.items.values()
        if self.kind == "keys":
            return [k for k, _ in pairs]
        if self.kind == "values":
            return [v for _, v in pairs]
        return [TupleValue([k, v]) for k, v in pairs]


class SetValue(_Mutable):
    """A set or set subclass; ``items`` maps the hashable key to its tracked value."""

    def __init__(self, items: dict[Any, Value], source: Source | None = None, cls: type = set):
        self.items = items
        self.source = source
        self.cls = cls
        self.attrs = {}

    def python_type(self) -> type:
        return self.cls

    def ordered(self) -> list[Value]:
        """The items in the order a real set of the same keys iterates them.

        Tensors hash by address, so a set of tensors has no order capture can know.
        """
        if any(getattr(v, "fake", None) is not None for v in self.items.values()):
            raise unsupported("unsupported_operator", "iterating a set of tensors")
        return [self.items[k] for k in set(self.items)]


class CellValue(Value):
    """A closure cell: tracked contents, or a real cell of the frame read through ``source``."""

    def __init__(
        self,
        contents: Value | None = None,
        real: Any = None,
        source: Source | None = None,
    ) -> None:
        self.contents = contents
        self.real = real
        self.source = source

    def python_type(self) -> type:
        return type(self.real) if self.real is not None else object
