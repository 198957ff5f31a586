"""``match`` statements: the MATCH_* instructions over tracked values.

Everything else a ``match`` compiles to (comparisons, ``len``, unpacking, jumps)
is ordinary bytecode; these four ask what Python's pattern matching asks, by the
rules of PEP 634 as CPython implements them: the type flags that make a class a
sequence or a mapping (``collections.abc`` registration included, ``str`` and
``bytes`` excluded), ``subject.get`` for mapping keys, and ``isinstance`` plus
``__match_args__`` and attribute reads for class patterns. Reads go through
:mod:`~kiln.capture.dispatch`, so a tensor subject, a module attribute or a
dataclass field is read as any other access would be, with its guards.
"""

from __future__ import annotations

import dis
from typing import TYPE_CHECKING, Any

from kiln.capture import builtin_calls, dispatch
from kiln.capture.breaks.reasons import UserException, raised
from kiln.capture.opcodes.common import registry
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import TupleValue
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

HANDLERS, handles = registry()

# CPython's type flags (Include/object.h) that pattern matching reads
_TPFLAGS_SEQUENCE = 1 << 5
_TPFLAGS_MAPPING = 1 << 6
_TPFLAGS_MATCH_SELF = 1 << 22


class _Missing:
    """The default handed to ``subject.get`` for a key the mapping lacks."""


_MISSING = _Missing()


def _has_flag(v: Value, flag: int) -> bool:
    return bool(v.python_type().__flags__ & flag)


@handles("MATCH_SEQUENCE")
def match_sequence(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ConstantValue(_has_flag(tr.peek(), _TPFLAGS_SEQUENCE)))


@handles("MATCH_MAPPING")
def match_mapping(tr: Tracer, ins: dis.Instruction) -> None:
    tr.push(ConstantValue(_has_flag(tr.peek(), _TPFLAGS_MAPPING)))


@handles("MATCH_KEYS")
def match_keys(tr: Tracer, ins: dis.Instruction) -> None:
    """The values of the pattern's keys in the subject, or None if one is missing."""
    keys = dispatch.unpack_iterable(tr, tr.peek())
    subject = tr.peek(2)
    values: list[Value] = []
    seen: list[Any] = []
    get = dispatch.get_attr(tr, subject, "get") if keys else None
    missing = ObjectValue(_MISSING)
    for key in keys:
        literal = key.as_constant() if isinstance(key, ConstantValue) else key
        if any(literal is k or literal == k for k in seen):
            raise raised(ValueError(f"mapping pattern checks duplicate key ({literal!r})"))
        seen.append(literal)
        assert get is not None
        value = dispatch.call(tr, get, [key, missing], {})
        if value is missing or (isinstance(value, ObjectValue) and value.obj is _MISSING):
            tr.push(ConstantValue(None))
            return
        values.append(value)
    tr.push(TupleValue(values))


@handles("MATCH_CLASS")
def match_class(tr: Tracer, ins: dis.Instruction) -> None:
    """``case C(p0, p1, k=p2)``: the attributes to match, or None when the subject is no C."""
    names = tr.pop().as_constant()
    cls_v = tr.pop()
    subject = tr.pop()
    tr.push(_match_class(tr, subject, cls_v, ins.arg or 0, tuple(names)))


def _match_class(
    tr: Tracer, subject: Value, cls_v: Value, nargs: int, names: tuple[str, ...]
) -> Value:
    cls = cls_v.obj if isinstance(cls_v, ObjectValue) else None
    if not isinstance(cls, type):
        raise raised(TypeError("called match pattern must be a class"))
    check = builtin_calls.handler_for(isinstance)
    assert check is not None
    if not dispatch.truth(tr, check(tr, [subject, cls_v], {})):
        return ConstantValue(None)
    attrs: list[Value] = []
    wanted: list[str] = []
    if nargs:
        match_args = _match_args(tr, cls_v, cls)
        match_self = match_args is None and bool(cls.__flags__ & _TPFLAGS_MATCH_SELF)
        allowed = 1 if match_self else len(match_args or ())
        if allowed < nargs:
            plural = "" if allowed == 1 else "s"
            msg = (
                f"{cls.__name__}() accepts {allowed} positional sub-pattern{plural} ({nargs} given)"
            )
            raise raised(TypeError(msg))
        if match_self:
            attrs.append(subject)
        else:
            assert match_args is not None
            for name in match_args[:nargs]:
                if not isinstance(name, str):
                    msg = f"__match_args__ elements must be strings (got {type(name).__name__})"
                    raise raised(TypeError(msg))
                wanted.append(name)
    wanted.extend(names)
    for i, name in enumerate(wanted):
        if name in wanted[:i]:
            msg = f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}"
            raise raised(TypeError(msg))
        value = _attribute(tr, subject, name)
        if value is None:
            return ConstantValue(None)
        attrs.append(value)
    return TupleValue(attrs)


def _match_args(tr: Tracer, cls_v: Value, cls: type) -> tuple[Any, ...] | None:
    """``cls.__match_args__`` (None when the class has none); it must be a tuple."""
    if not hasattr(cls, "__match_args__"):
        return None
    value = dispatch.get_attr(tr, cls_v, "__match_args__")
    if isinstance(value, TupleValue):
        items = [v.as_constant() for v in value.items]
    elif isinstance(value, ConstantValue) and isinstance(value.value, tuple):
        items = list(value.value)
    else:
        got = value.python_type().__name__
        raise raised(TypeError(f"{cls.__name__}.__match_args__ must be a tuple (got {got})"))
    return tuple(items)


def _attribute(tr: Tracer, subject: Value, name: str) -> Value | None:
    """``subject.name``, or None where reading it raises AttributeError (no match)."""
    try:
        return dispatch.get_attr(tr, subject, name)
    except UserException as e:
        if isinstance(e.exc, AttributeError):
            return None
        raise
