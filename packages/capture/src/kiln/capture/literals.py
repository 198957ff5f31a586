"""Plain Python values of tracked constants, and the calls capture makes with them.

A constant, or a container of constants, stands for a Python value capture knows exactly:
:func:`literal` gives it back, :func:`fold` calls a pure function on such values at capture time
(``len``, ``min``, ``str.join``, numpy on constants) and tracks the result, and
:func:`replay_call` records a call the emitted code makes after the graph (``print``, logging).
Every evaluator module needs these; they depend on the value kinds alone.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, DictViewValue, ListValue, SetValue, TupleValue
from kiln.capture.values.objects import ObjectValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["fold", "is_literal", "literal", "refuse_by_type", "replay_call"]

_IDENTITY_OBJECTS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)


def literal(v: Value) -> Any:
    """The plain Python value of a constant or a container of constants."""
    if isinstance(v, ConstantValue):
        return v.value
    if isinstance(v, TupleValue) and v.cls is tuple:
        return tuple(literal(x) for x in v.items)
    if isinstance(v, ListValue):
        return [literal(x) for x in v.items]
    if isinstance(v, DictValue) and v.cls is dict:
        return {k: literal(x) for k, (_, x) in v.items.items()}
    if isinstance(v, DictViewValue):  # a real view of a dict with the same items
        return getattr(literal(DictValue(v.dict.items)), v.kind)()
    if isinstance(v, ObjectValue) and isinstance(v.obj, _IDENTITY_OBJECTS):
        return v.obj
    if isinstance(v, ObjectValue) and isinstance(v.obj, BaseException) and v.source is None:
        return v.obj  # raised and caught in the trace: nothing else holds it
    raise unsupported("unsupported_value", f"{v} is not a constant")


def is_literal(v: Value) -> bool:
    try:
        literal(v)
    except Exception:
        return False
    return True


def fold(fn: Callable[..., Any], args: list[Value], kwargs: dict[str, Value]) -> Value:
    """Call a pure ``fn`` on the plain values of constant arguments; wrap the result."""
    plain_args = [literal(a) for a in args]
    plain_kwargs = {k: literal(v) for k, v in kwargs.items()}
    try:
        result = fn(*plain_args, **plain_kwargs)
    except Exception as e:
        raise raised(e) from e
    return _fresh(result)


def _fresh(obj: Any) -> Value:
    """A tracked value for a new object only the trace holds (a fold's result): mutable."""
    if is_constant(obj):
        return ConstantValue(obj)
    if type(obj) is list:
        return ListValue([_fresh(x) for x in obj])
    if type(obj) is tuple:
        return TupleValue([_fresh(x) for x in obj])
    if type(obj) is dict:
        return DictValue({k: (_fresh(k), _fresh(v)) for k, v in obj.items()})
    if type(obj) in (set, frozenset):
        return SetValue({x: _fresh(x) for x in obj})
    return ObjectValue(obj)


def replay_call(tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """Record a call with constant arguments, made by the emitted code after the graph."""
    if not all(is_literal(a) for a in [*args, *kwargs.values()]):
        name = getattr(fn, "__qualname__", repr(fn))
        raise unsupported("side_effect", f"{name} with arguments that are not constants")
    tr.out.side_effects.record_call(
        fn,
        tuple(literal(a) for a in args),
        {k: literal(v) for k, v in kwargs.items()},
    )
    return ConstantValue(None)


def refuse_by_type(v: ConstantValue, methods: tuple[str, ...], op: Any, *operands: Any) -> None:
    """Raise, in the traced program, the TypeError Python raises for ``op`` on ``v``'s type.

    A constant whose type has none of ``methods`` (``None[...]``, ``None(...)``, ``x in None``,
    item assignment to a tuple) makes Python raise whatever the other operands are, so the program's handlers
    see it, or the frame runs eagerly. Breaking the graph instead would run the operation in
    Python after the graph, raising where eager does not when the trace took a path eager
    does not (library code's branch for ``torch.compiler.is_compiling()``).
    """
    if any(hasattr(type(v.value), m) for m in methods):
        return
    try:  # the type refuses before it reads an operand: CPython's own message
        op(v.value, *operands)
    except TypeError as e:
        raise raised(e) from None
