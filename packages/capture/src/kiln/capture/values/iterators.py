"""Iterators unrolled at capture time: over items, and lazy zip/enumerate/map/filter."""

from __future__ import annotations

from collections.abc import Callable

from kiln.capture.breaks.reasons import raised
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import TupleValue

__all__ = [
    "EnumerateIterator",
    "GeneratorIterator",
    "ItemsIterator",
    "IteratorValue",
    "MapIterator",
    "ZipIterator",
    "leaving_generator",
]

CallFn = Callable[[Value, list[Value]], Value]
TruthFn = Callable[[Value], bool]


class IteratorValue(Value):
    """An iterator; :meth:`next` gives the next value or None when exhausted."""

    def python_type(self) -> type:
        return type(iter(()))

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        raise NotImplementedError


class ItemsIterator(IteratorValue):
    """Iteration over a known list of values."""

    def __init__(self, items: list[Value]) -> None:
        self.items = items
        self.pos = 0

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]


class GeneratorIterator(ItemsIterator):
    """A generator inlined at its call: the items it yielded, then the value it returned.

    The generator runs to its end when called (nothing is ever sent into it), so
    ``yield from`` over it (``SEND``) hands on its items and takes ``returned`` as
    the value of the expression, as Python does with ``StopIteration.value``. An
    exception that ended it (``error``) is raised where Python raises it: when the
    item after the last one yielded is asked for, so a consumer that stops early
    (``next(g)``, a loop left with ``break``) never sees it.
    """

    def __init__(
        self, items: list[Value], returned: Value, error: BaseException | None = None
    ) -> None:
        super().__init__(items)
        self.returned = returned
        self.error = error

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        item = super().next(call, truth)
        if item is None and self.error is not None:
            raise raised(self.error)
        return item


def leaving_generator(exc: BaseException) -> BaseException:
    """The exception a generator's caller sees for ``exc`` raised in its body (PEP 479)."""
    if not isinstance(exc, StopIteration):
        return exc
    error = RuntimeError("generator raised StopIteration")
    error.__cause__ = error.__context__ = exc
    return error


class ZipIterator(IteratorValue):
    """``zip(*iterators)``: stops at the shortest, or with ``strict`` raises unless all end."""

    def __init__(self, parts: list[IteratorValue], strict: bool = False) -> None:
        self.parts = parts
        self.strict = strict

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        out = []
        for i, part in enumerate(self.parts):
            v = part.next(call, truth)
            if v is None:
                if self.strict:
                    self._check_all_ended(i, call, truth)
                return None
            out.append(v)
        return TupleValue(out)

    def _check_all_ended(self, ended: int, call: CallFn, truth: TruthFn) -> None:
        """Python's ``zip(strict=True)`` ValueError when part ``ended`` ran out alone."""
        if ended > 0:
            first = "argument 1" if ended == 1 else f"arguments 1-{ended}"
            msg = f"zip() argument {ended + 1} is shorter than {first}"
            raise raised(ValueError(msg))
        for i, part in enumerate(self.parts[1:], start=1):
            if part.next(call, truth) is not None:
                first = "argument 1" if i == 1 else f"arguments 1-{i}"
                raise raised(ValueError(f"zip() argument {i + 1} is longer than {first}"))


class EnumerateIterator(IteratorValue):
    """``enumerate(iterator, start)``."""

    def __init__(self, inner: IteratorValue, start: int) -> None:
        self.inner = inner
        self.count = start

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        v = self.inner.next(call, truth)
        if v is None:
            return None
        self.count += 1
        return TupleValue([ConstantValue(self.count - 1), v])


class MapIterator(IteratorValue):
    """``map(fn, *iterators)`` or, with ``keep`` set, ``filter(fn, iterator)``."""

    def __init__(self, fn: Value | None, parts: list[IteratorValue], keep: bool = False) -> None:
        self.fn = fn
        self.parts = parts
        self.keep = keep

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        while True:
            args = []
            for part in self.parts:
                v = part.next(call, truth)
                if v is None:
                    return None
                args.append(v)
            if not self.keep:
                assert self.fn is not None
                return call(self.fn, args)
            keep = truth(args[0] if self.fn is None else call(self.fn, args))
            if keep:
                return args[0]
