"""Guard kinds on plain values: constants, truth, ``None``, types, container shapes.

Each class is everything kiln.guards does with its kind (see :mod:`kiln.guards.kinds.base`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kiln.capture import guard_data
from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.guards import stamps
from kiln.guards.kinds.base import Emitter, Kind, Rank, Reach, kind_of, register

__all__ = [
    "Bool",
    "CachedCall",
    "DictKeys",
    "Equals",
    "Finite",
    "HasAttr",
    "IsNone",
    "NotInInstanceDict",
    "NotNone",
    "SequenceLength",
    "TypeMatch",
    "type_name",
]

ANY_REACH: frozenset[Reach] = frozenset({"module", "tensor", "value", "object"})
"""Every way of hanging off module state: a kind the stamp protects wherever it is."""


def type_name(obj: Any) -> str:
    return type(obj).__qualname__


@register(GuardKind.EQUALS)
class Equals(Kind):
    """A constant, compared with ``==`` after its exact type (``1 == 1.0 == True``)."""

    rank = Rank.COMPARISON
    reads_twice = True
    tests_type = True
    stamp_protects = frozenset({"value"})

    def known_type(self, expected: Any) -> type | None:
        return type(expected)

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        expected = guard.expected
        same_type = f"type({v}) is {out.bind(type(expected), 'T')}"
        if isinstance(expected, float) and math.isnan(expected):
            return f"{same_type} and {v} != {v}"  # NaN equals nothing, itself included
        return f"{same_type} and {v} == {out.literal(expected)}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        expected = guard.expected
        if type(value) is type(expected):
            nan = isinstance(expected, float) and math.isnan(expected)
            if math.isnan(value) if nan else (value == expected):
                return None
        if type(value) is not type(expected):
            return (
                f"{where} changed: expected {expected!r} ({type_name(expected)}), "
                f"got {value!r} ({type_name(value)})"
            )
        return f"{where} changed: expected {expected!r}, got {value!r}"


@register(GuardKind.BOOL)
class Bool(Kind):
    """The value's truth."""

    rank = Rank.COMPARISON
    stamp_protects = frozenset({"value"})

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return v if guard.expected else f"not {v}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        got, want = bool(value), bool(guard.expected)
        return None if got is want else f"{where} changed: expected {want}, got {got}"


@register(GuardKind.IS_NONE)
class IsNone(Kind):
    rank = Rank.COMPARISON
    stamp_protects = frozenset({"value"})

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"{v} is None"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        return None if value is None else f"{where} changed: expected None, got {type_name(value)}"


@register(GuardKind.NOT_NONE)
class NotNone(Kind):
    """Dropped where another guard on the source pins a type other than ``NoneType``."""

    rank = Rank.COMPARISON
    stamp_protects = ANY_REACH

    def implied(self, guard: GuardSpec, others: Sequence[GuardSpec]) -> bool:
        known = (kind_of(o.kind).known_type(o.expected) for o in others)
        return any(t is not None and t is not type(None) for t in known)

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"{v} is not None"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        return None if value is not None else f"{where} changed: expected not None, got None"


@register(GuardKind.FINITE)
class Finite(Kind):
    """A float that is neither infinite nor NaN (``v - v`` is 0.0 for those alone). It runs
    after the comparisons, so the float's type is checked first."""

    rank = Rank.CONTAINER
    reads_twice = True

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"{v} - {v} == 0.0"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where} changed: expected a finite float, got {value!r}"
        return None


@register(GuardKind.TYPE_MATCH)
class TypeMatch(Kind):
    """The exact type; the dict types module watching swaps in count as ``dict``. Dropped
    where another guard on the source tests the same type itself."""

    rank = Rank.COMPARISON
    stamp_protects = ANY_REACH

    def known_type(self, expected: Any) -> type | None:
        return expected  # type: ignore[no-any-return]

    def implied(self, guard: GuardSpec, others: Sequence[GuardSpec]) -> bool:
        for o in others:
            kind = kind_of(o.kind)
            if kind.tests_type and kind.known_type(o.expected) is guard.expected:
                return True
        return False

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        same = stamps.SAME_TYPES.get(guard.expected)
        if same is not None:
            return f"type({v}) in {out.bind(same, 'same_types')}"
        return f"type({v}) is {out.bind(guard.expected, 'T')}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        expected = guard.expected
        if type(value) in stamps.SAME_TYPES.get(expected, (expected,)):
            return None
        return f"{where} type changed: expected {expected.__qualname__}, got {type_name(value)}"


@register(GuardKind.DICT_KEYS)
class DictKeys(Kind):
    """The keys, in order."""

    rank = Rank.CONTAINER

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        if not guard.expected and v in out.varkw:
            return f"not {v}"  # ``**kwargs`` is always a fresh dict
        return f"tuple({v}) == {out.literal(tuple(guard.expected))}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        got, want = tuple(value), tuple(guard.expected)
        return None if got == want else f"{where} keys changed: expected {want!r}, got {got!r}"


@register(GuardKind.SEQUENCE_LENGTH)
class SequenceLength(Kind):
    rank = Rank.CONTAINER

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"len({v}) == {int(guard.expected)}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        n = len(value)
        if n == guard.expected:
            return None
        return f"len({where}) changed: expected {guard.expected}, got {n}"


@register(GuardKind.HASATTR)
class HasAttr(Kind):
    """Whether the value has an attribute: ``expected`` is (name, bool)."""

    rank = Rank.CONTAINER

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        name, want = guard.expected
        return f"hasattr({v}, {name!r}) is {bool(want)!r}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        name, want = guard.expected
        got = hasattr(value, name)
        if got is want:
            return None
        return f"hasattr({where}, {name!r}) changed: expected {want}, got {got}"


@register(GuardKind.NOT_IN_INSTANCE_DICT)
class NotInInstanceDict(Kind):
    """The value's own ``__dict__`` lacks a name: ``expected`` is the name. The trace found a
    method (or another non-data descriptor) on the class, which an instance attribute set
    later (``a.f = other``) would shadow. A module's ``__dict__`` is watched, so under a module
    tree the stamp sees every write that could make it fail."""

    rank = Rank.CONTAINER
    stamp_protects = frozenset({"module"})

    def accepts(self, expected: Any) -> bool:
        return isinstance(expected, str)

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"{guard.expected!r} not in {v}.__dict__"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        own = getattr(value, "__dict__", None)
        if own is None:
            return f"{where} has no __dict__ any more"
        if guard.expected not in own:
            return None
        return f"{where}.{guard.expected} is now set on the instance, shadowing its class's"


@register(GuardKind.CACHED_CALL)
class CachedCall(Kind):
    """A functools cache function still answers its arguments with the constant the trace
    used: ``expected`` is a :class:`kiln.capture.guard_data.CachedCall`. The check calls it,
    a cache hit; after ``cache_clear`` or an eviction it recomputes, as eager's call would."""

    rank = Rank.CALL
    has_source = False

    def accepts(self, expected: Any) -> bool:
        return isinstance(expected, guard_data.CachedCall)

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"{out.bind(guard.expected, 'cached_call')}.holds()"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        if guard.expected.holds():
            return None
        return f"{guard.expected!r} no longer: its cache was cleared or evicted it"
