"""Iterators unrolled at capture time: over items, and lazy zip/enumerate/map/filter/itertools.

The lazy ones advance the iterators they read only as far as their consumer asks, as
Python's do, so an iterator shared between two of them (``islice(it, 2)`` then
``list(it)``) gives each the items it gets in Python, and infinite ones (``count()``,
``repeat(x)``, ``cycle``) work under a consumer that stops.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from kiln.capture.breaks.reasons import raised
from kiln.capture.errors import Unsupported
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import TupleValue

__all__ = [
    "AccumulateIterator",
    "BatchedIterator",
    "ChainIterator",
    "CompressIterator",
    "CountIterator",
    "CycleIterator",
    "EnumerateIterator",
    "GeneratorIterator",
    "IsliceIterator",
    "ItemsIterator",
    "IteratorValue",
    "MapIterator",
    "PairwiseIterator",
    "RepeatIterator",
    "StarmapIterator",
    "WhileIterator",
    "ZipIterator",
    "ZipLongestIterator",
    "leaving_generator",
    "remaining",
]

CallFn = Callable[[Value, list[Value]], Value]
TruthFn = Callable[[Value], bool]


class IteratorValue(Value):
    """An iterator; :meth:`next` gives the next value or None when exhausted."""

    def python_type(self) -> type:
        return type(iter(()))

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        raise NotImplementedError

    def save(self) -> Callable[[], None]:
        """A function that puts this iterator, and the iterators it reads, back as they are now.

        A rolled-back instruction may have advanced them; lists among the state are copied
        (a cycle's saved items grow).
        """
        state = {k: list(v) if isinstance(v, list) else v for k, v in vars(self).items()}
        inner = [it.save() for it in self.reads()]

        def restore() -> None:
            vars(self).update({k: list(v) if isinstance(v, list) else v for k, v in state.items()})
            for undo in inner:
                undo()

        return restore

    def reads(self) -> list[IteratorValue]:
        """The iterators this one advances."""
        found: list[IteratorValue] = []
        for v in vars(self).values():
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, IteratorValue):
                    found.append(x)
        return found


class _Stop(Exception):
    """Stepping an iterator for :func:`remaining` needed a call or a non-constant truth."""


def _no_call(fn: Value, args: list[Value]) -> Value:
    raise _Stop


def _constant_truth(v: Value) -> bool:
    if not v.is_constant():
        raise _Stop
    return bool(v.as_constant())


def remaining(it: IteratorValue, limit: int = 10_000) -> list[Value] | None:
    """What ``it`` still yields, leaving it where it is; None where finding out would call
    a function, test the truth of a non-constant, raise, or take over ``limit`` items."""
    if isinstance(it, ItemsIterator) and not isinstance(it, GeneratorIterator):
        return it.items[it.pos :]
    undo = it.save()
    items: list[Value] = []
    try:
        while len(items) <= limit:
            x = it.next(_no_call, _constant_truth)
            if x is None:
                return items
            items.append(x)
        return None
    except (_Stop, Unsupported):
        return None
    finally:
        undo()


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

    def save(self) -> Callable[[], None]:
        pos = self.pos  # the items never change

        def restore() -> None:
            self.pos = pos

        return restore


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
    """``map(fn, *iterators)`` or, with ``keep`` set, ``filter(fn, iterator)`` (with ``invert``
    too, ``itertools.filterfalse``)."""

    def __init__(
        self, fn: Value | None, parts: list[IteratorValue], keep: bool = False, invert: bool = False
    ) -> None:
        self.fn = fn
        self.parts = parts
        self.keep = keep
        self.invert = invert

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
            if keep != self.invert:
                return args[0]


class RepeatIterator(IteratorValue):
    """``itertools.repeat(obj, times)``; without ``times`` it never ends."""

    def __init__(self, obj: Value, times: int | None) -> None:
        self.obj = obj
        self.times = times

    def python_type(self) -> type:
        return itertools.repeat

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if self.times is not None:
            if self.times <= 0:
                return None
            self.times -= 1
        return self.obj


class CountIterator(IteratorValue):
    """``itertools.count(start, step)`` over constant numbers."""

    def __init__(self, start: Any, step: Any) -> None:
        self.current = start
        self.step = step

    def python_type(self) -> type:
        return itertools.count

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        out = self.current
        self.current = out + self.step
        return ConstantValue(out)


class CycleIterator(IteratorValue):
    """``itertools.cycle(iterable)``: its items, saved as they are read, then again forever."""

    def __init__(self, inner: IteratorValue) -> None:
        self.inner: IteratorValue | None = inner
        self.saved: list[Value] = []
        self.pos = 0

    def python_type(self) -> type:
        return itertools.cycle

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if self.inner is not None:
            v = self.inner.next(call, truth)
            if v is not None:
                self.saved.append(v)
                return v
            self.inner = None
        if not self.saved:
            return None
        self.pos += 1
        return self.saved[(self.pos - 1) % len(self.saved)]


class ChainIterator(IteratorValue):
    """``itertools.chain``: the items of each of ``parts`` in turn, then, for
    ``chain.from_iterable``, of each iterable ``outer`` yields, made an iterator by
    ``make_iter`` only when the one before it is used up, as Python does."""

    def __init__(
        self,
        parts: list[IteratorValue],
        outer: IteratorValue | None = None,
        make_iter: Callable[[Value], IteratorValue] | None = None,
    ) -> None:
        self.parts = parts
        self.outer = outer
        self.make_iter = make_iter

    def python_type(self) -> type:
        return itertools.chain

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        while True:
            if self.parts:
                v = self.parts[0].next(call, truth)
                if v is not None:
                    return v
                self.parts = self.parts[1:]
                continue
            source = None if self.outer is None else self.outer.next(call, truth)
            if source is None:
                return None
            assert self.make_iter is not None
            self.parts = [self.make_iter(source)]


class IsliceIterator(IteratorValue):
    """``itertools.islice(iterator, start, stop, step)``, reading ``inner`` as CPython does:
    items before ``start`` and between steps are read and dropped, none after ``stop``."""

    def __init__(self, inner: IteratorValue, start: int, stop: int | None, step: int) -> None:
        self.inner: IteratorValue | None = inner
        self.next_index = start
        self.stop = stop
        self.step = step
        self.count = 0

    def python_type(self) -> type:
        return itertools.islice

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if self.inner is None:
            return None
        while self.count < self.next_index:
            if self.inner.next(call, truth) is None:
                self.inner = None
                return None
            self.count += 1
        if self.stop is not None and self.count >= self.stop:
            self.inner = None
            return None
        v = self.inner.next(call, truth)
        if v is None:
            self.inner = None
            return None
        self.count += 1
        self.next_index += self.step
        if self.stop is not None and self.next_index > self.stop:
            self.next_index = self.stop
        return v


class AccumulateIterator(IteratorValue):
    """``itertools.accumulate(iterable, func, initial=...)``: running ``func(total, item)``."""

    def __init__(self, inner: IteratorValue, func: Value, initial: Value | None) -> None:
        self.inner = inner
        self.func = func
        self.total = initial
        self.started = False

    def python_type(self) -> type:
        return itertools.accumulate

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if not self.started and self.total is not None:
            self.started = True
            return self.total
        self.started = True
        v = self.inner.next(call, truth)
        if v is None:
            return None
        self.total = v if self.total is None else call(self.func, [self.total, v])
        return self.total


class PairwiseIterator(IteratorValue):
    """``itertools.pairwise(iterable)``: each item with the one after it."""

    def __init__(self, inner: IteratorValue) -> None:
        self.inner = inner
        self.last: Value | None = None

    def python_type(self) -> type:
        return type(itertools.pairwise(()))

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if self.last is None:
            self.last = self.inner.next(call, truth)
            if self.last is None:
                return None
        v = self.inner.next(call, truth)
        if v is None:
            return None
        pair = TupleValue([self.last, v])
        self.last = v
        return pair


class ZipLongestIterator(IteratorValue):
    """``itertools.zip_longest(*iterables, fillvalue=...)``: to the longest, the rest filled."""

    def __init__(self, parts: list[IteratorValue], fill: Value) -> None:
        self.parts = parts
        self.fill = fill
        self.ended = [False] * len(parts)

    def python_type(self) -> type:
        return itertools.zip_longest

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if all(self.ended):
            return None
        out: list[Value] = []
        for i, part in enumerate(self.parts):
            v = None if self.ended[i] else part.next(call, truth)
            if v is None:
                self.ended[i] = True
            out.append(self.fill if v is None else v)
        return None if all(self.ended) else TupleValue(out)


class CompressIterator(IteratorValue):
    """``itertools.compress(data, selectors)``: the items whose selector is true."""

    def __init__(self, data: IteratorValue, selectors: IteratorValue) -> None:
        self.data = data
        self.selectors = selectors

    def python_type(self) -> type:
        return itertools.compress

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        while True:
            v = self.data.next(call, truth)
            s = None if v is None else self.selectors.next(call, truth)
            if v is None or s is None:
                return None
            if truth(s):
                return v


class WhileIterator(IteratorValue):
    """``itertools.takewhile`` (``take``) or ``dropwhile`` (not ``take``) of ``predicate``."""

    def __init__(self, predicate: Value, inner: IteratorValue, take: bool) -> None:
        self.predicate = predicate
        self.inner = inner
        self.take = take
        self.done = False

    def python_type(self) -> type:
        return itertools.takewhile if self.take else itertools.dropwhile

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        if self.take and self.done:
            return None
        while True:
            v = self.inner.next(call, truth)
            if v is None or (self.done and not self.take):
                return v
            if not truth(call(self.predicate, [v])):
                self.done = True
                return None if self.take else v
            if self.take:
                return v


class StarmapIterator(IteratorValue):
    """``itertools.starmap(fn, iterable)``: ``fn(*item)``, ``unpack`` giving the arguments."""

    def __init__(self, fn: Value, inner: IteratorValue, unpack: Value) -> None:
        self.fn = fn
        self.inner = inner
        self.unpack = unpack

    def python_type(self) -> type:
        return itertools.starmap

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        v = self.inner.next(call, truth)
        if v is None:
            return None
        args = call(self.unpack, [v])
        assert isinstance(args, TupleValue)
        return call(self.fn, list(args.items))


class BatchedIterator(IteratorValue):
    """``itertools.batched(iterable, n)`` (3.12): tuples of ``n`` items, the last shorter."""

    def __init__(self, inner: IteratorValue, n: int) -> None:
        self.inner = inner
        self.n = n

    def python_type(self) -> type:
        return getattr(itertools, "batched", tuple)

    def next(self, call: CallFn, truth: TruthFn) -> Value | None:
        batch: list[Value] = []
        while len(batch) < self.n:
            v = self.inner.next(call, truth)
            if v is None:
                break
            batch.append(v)
        return TupleValue(batch) if batch else None
