"""Python builtins and container methods over tracked values.

``len``, ``isinstance``, ``range``, ``zip``, ``list(...)``, ``dict.items()``
and friends are evaluated at capture time on tracked values; any tensor that
flows through them stays a graph value. Iteration (:func:`iterate`) is
shared with GET_ITER / FOR_ITER.
"""

from __future__ import annotations

import collections
import copy
import functools
import inspect
import operator
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kiln.capture import (
    attributes,
    builtin_types,
    container_methods,
    copies,
    dispatch,
    distributed,
    functorch_calls,
    iteration,
    itertools_calls,
    literals,
    numpy_calls,
    operators,
    side_effects,
    symbolic_numbers,
    torch_calls,
)
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import (
    DictValue,
    ListValue,
    SetValue,
    TupleValue,
    dict_key,
)
from kiln.capture.values.functions import BoundMethodValue, PartialValue
from kiln.capture.values.iterators import (
    EnumerateIterator,
    ItemsIterator,
    IteratorValue,
    MapIterator,
    ZipIterator,
)
from kiln.capture.values.ndarray import NdarrayValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue, SuperValue, WeakRefValue
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import TensorValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["Handler", "handler_for"]

Handler = Callable[["Tracer", list[Value], dict[str, Value]], Value]
_HANDLERS: dict[Any, Handler] = {
    **itertools_calls.HANDLERS,
    **functorch_calls.HANDLERS,
    **distributed.HANDLERS,
}


def _handles(*objs: Any) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for obj in objs:
            _HANDLERS[obj] = fn
        return fn

    return register


def handler_for(obj: Any) -> Handler | None:
    try:
        return _HANDLERS.get(obj)
    except TypeError:  # unhashable callable
        return None


def _all_literal(args: list[Value], kwargs: dict[str, Value]) -> bool:
    return all(literals.is_literal(a) for a in [*args, *kwargs.values()])


@_handles(len)
def _len(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(dispatch.length(tr, args[0]))


def _types_of(v: Value) -> tuple[type, ...]:
    if isinstance(v, ObjectValue) and isinstance(v.obj, type):
        return (v.obj,)
    if isinstance(v, ObjectValue) and isinstance(v.obj, tuple):
        return tuple(v.obj)
    if isinstance(v, TupleValue):
        return tuple(t for x in v.items for t in _types_of(x))
    if isinstance(v, ConstantValue) and isinstance(v.value, tuple):
        return tuple(v.value)
    if isinstance(v, ObjectValue):  # typing aliases and ABCs
        return (v.obj,)
    raise unsupported("unsupported_operator", f"isinstance against {v}")


@_handles(isinstance)
def _isinstance(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    v, types_v = args
    cls = v.python_type()
    if isinstance(v, (ObjectValue, ConstantValue)) and not isinstance(v, SymValue):
        obj = v.obj if isinstance(v, ObjectValue) else v.value
        return ConstantValue(isinstance(obj, _types_of(types_v)))
    return ConstantValue(issubclass(cls, _types_of(types_v)))


@_handles(issubclass)
def _issubclass(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    cls = _types_of(args[0])[0]
    return ConstantValue(issubclass(cls, _types_of(args[1])))


@_handles(type)
def _type(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if len(args) != 1:
        raise unsupported("unsupported_call", "type() with three arguments")
    return ObjectValue(args[0].python_type())


@_handles(getattr)
def _getattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    name = args[1].as_constant()
    if len(args) == 3 and not dispatch.has_attr(tr, args[0], name):
        return args[2]
    return dispatch.get_attr(tr, args[0], name)


@_handles(vars)
def _vars(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if len(args) != 1 or kwargs:
        raise unsupported("unsupported_call", "vars() without an object")
    return dispatch.get_attr(tr, args[0], "__dict__")


@_handles(hasattr)
def _hasattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(dispatch.has_attr(tr, args[0], args[1].as_constant()))


@_handles(setattr)
def _setattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    dispatch.set_attr(tr, args[0], args[1].as_constant(), args[2])
    return ConstantValue(None)


@_handles(delattr)
def _delattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    dispatch.delete_attr(tr, args[0], args[1].as_constant())
    return ConstantValue(None)


@_handles(object.__setattr__)
def _object_setattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    dispatch.set_attr(tr, args[0], args[1].as_constant(), args[2], plain=True)
    return ConstantValue(None)


@_handles(object.__getattribute__)
def _object_getattribute(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    v, name = args[0], args[1].as_constant()
    if isinstance(v, ObjectValue):
        return attributes.plain_object_attr(tr, v, name)
    if isinstance(v, NewObjectValue):
        return attributes.plain_new_object_attr(tr, v, name)
    return dispatch.get_attr(tr, v, name)


@_handles(tuple.__new__)
def _tuple_new(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return builtin_types.new_tuple(tr, args, kwargs)


@_handles(object.__new__)
def _object_new(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    cls = _types_of(args[0])[0]
    return NewObjectValue(cls)


@_handles(range)
def _range(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return literals.fold(range, args, kwargs)


@_handles(slice)
def _slice(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return literals.fold(slice, args, kwargs)


@_handles(iter)
def _iter(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return dispatch.iterate(tr, args[0])


@_handles(next)
def _next(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    it = args[0]
    if not isinstance(it, IteratorValue):
        raise unsupported("unsupported_operator", f"next({it})")
    item = iteration.next_item(tr, it)
    if item is None:
        if len(args) == 2:
            return args[1]
        raise raised(StopIteration())
    return item


@_handles(enumerate)
def _enumerate(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    return EnumerateIterator(dispatch.iterate(tr, args[0]), int(start.as_constant()))


@_handles(zip)
def _zip(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    strict = bool(kwargs["strict"].as_constant()) if "strict" in kwargs else False
    return ZipIterator([dispatch.iterate(tr, a) for a in args], strict)


@_handles(map)
def _map(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return MapIterator(args[0], [dispatch.iterate(tr, a) for a in args[1:]])


@_handles(filter)
def _filter(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn = None if isinstance(args[0], ConstantValue) and args[0].is_none() else args[0]
    return MapIterator(fn, [dispatch.iterate(tr, args[1])], keep=True)


@_handles(reversed)
def _reversed(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ItemsIterator(list(reversed(dispatch.unpack_iterable(tr, args[0]))))


@_handles(list)
def _list(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ListValue(dispatch.unpack_iterable(tr, args[0]) if args else [])


@_handles(tuple)
def _tuple(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return TupleValue(dispatch.unpack_iterable(tr, args[0]) if args else [])


@_handles(set, frozenset)
def _set(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    items = dispatch.unpack_iterable(tr, args[0]) if args else []
    return SetValue({dict_key(x): x for x in items})


def _dict_handler(cls: type) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return container_methods.make_dict(tr, args, kwargs, cls)

    return handler


_HANDLERS[dict] = _dict_handler(dict)
_HANDLERS[copy.copy], _HANDLERS[copy.deepcopy] = copies.shallow_copy, copies.deep_copy
_HANDLERS[collections.OrderedDict] = _dict_handler(collections.OrderedDict)


def _fromkeys_handler(cls: type) -> Handler:
    """``dict.fromkeys(keys, value=None)``: every key maps to the one ``value`` object."""

    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if kwargs or not 1 <= len(args) <= 2:
            raise unsupported("unsupported_call", f"{cls.__name__}.fromkeys with these arguments")
        value = args[1] if len(args) == 2 else ConstantValue(None)
        out = DictValue({}, cls)
        for key in dispatch.unpack_iterable(tr, args[0]):
            out.set(key, value)
        return out

    return handler


for _cls in (dict, collections.OrderedDict):
    _HANDLERS[_cls.fromkeys] = _fromkeys_handler(_cls)


def _sort_keys(tr: Tracer, items: list[Value], key: Value | None) -> list[Any]:
    """The constant sort key of each item (``key(item)`` inlined when given)."""
    keys = [item if key is None else dispatch.call(tr, key, [item], {}) for item in items]
    if not all(literals.is_literal(k) for k in keys):
        raise unsupported("unsupported_call", "ordering values that are not constants")
    return [literals.literal(k) for k in keys]


def _ordered(
    tr: Tracer, items: list[Value], kwargs: dict[str, Value]
) -> list[tuple[Any, int, Value]]:
    key = kwargs.get("key")
    key = None if isinstance(key, ConstantValue) and key.is_none() else key
    keys = _sort_keys(tr, items, key)
    return [(k, i, item) for i, (k, item) in enumerate(zip(keys, items, strict=True))]


@_handles(sorted)
def _sorted(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    ordered = _ordered(tr, dispatch.unpack_iterable(tr, args[0]), kwargs)
    reverse = bool(kwargs["reverse"].as_constant()) if "reverse" in kwargs else False
    try:
        ordered.sort(key=lambda e: e[0], reverse=reverse)
    except TypeError as e:
        raise raised(e) from e
    return ListValue([item for _, _, item in ordered])


@_handles(functools.reduce)
def _reduce(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    items = dispatch.unpack_iterable(tr, args[1])
    if len(args) > 2:
        items = [args[2], *items]
    if not items:
        raise raised(TypeError("reduce() of empty iterable with no initial value"))
    total = items[0]
    for item in items[1:]:
        total = dispatch.call(tr, args[0], [total, item], {})
    return total


def _min_max_handler(fn: Callable[..., Any]) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        items = args if len(args) > 1 else dispatch.unpack_iterable(tr, args[0])
        if any(isinstance(x, TensorValue) for x in items):
            raise unsupported("data_dependent_value", f"{fn.__name__}() over tensors")
        if not items:
            if "default" in kwargs:
                return kwargs["default"]
            raise raised(ValueError(f"{fn.__name__}() arg is an empty sequence"))
        ordered = _ordered(tr, items, kwargs)
        return fn(ordered, key=lambda e: (e[0], e[1] if fn is min else -e[1]))[2]

    return handler


_HANDLERS[min] = _min_max_handler(min)
_HANDLERS[max] = _min_max_handler(max)


@_handles(sum)
def _sum(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    items = dispatch.unpack_iterable(tr, args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    for x in items:
        total = dispatch.binary_op(tr, "+", total, x)
    return total


@_handles(any)
def _any(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(any(dispatch.truth(tr, x) for x in dispatch.unpack_iterable(tr, args[0])))


@_handles(all)
def _all(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(all(dispatch.truth(tr, x) for x in dispatch.unpack_iterable(tr, args[0])))


@_handles(abs)
def _abs(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if isinstance(args[0], TensorValue):
        return torch_calls.call_function(tr, operator.abs, args, {})
    if isinstance(args[0], NdarrayValue):
        return numpy_calls.unary_op(tr, "abs", args[0])
    if isinstance(args[0], SymValue) and not kwargs:  # ``abs(n)`` stays symbolic
        return symbolic_numbers.number_value(operator.abs(args[0].sym))  # type: ignore[arg-type]
    return literals.fold(abs, args, kwargs)


@_handles(bool)
def _bool(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(dispatch.truth(tr, args[0]) if args else False)


def _scalar_handler(fn: Callable[..., Any]) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        one_tensor = len(args) == 1 and isinstance(args[0], TensorValue)
        if fn in (int, float) and one_tensor and tr.out.dynamic.scalar_outputs:
            # int(t) is t.__int__(): a value from data, an unbacked symbol
            method = "__int__" if fn is int else "__float__"
            return torch_calls.call_method(tr, args[0], method, [], {})  # type: ignore[arg-type]
        number = args[0] if len(args) == 1 and isinstance(args[0], SymValue) else None
        if fn is float and number is not None and tr.out.from_data(number) == ():
            # a number from data has no value to specialize on: float(n) stays symbolic
            number_type = number.python_type()
            if number_type is float:
                return number
            if number_type is int:
                return SymValue(number.sym.__sym_float__())  # type: ignore[union-attr]
        for a in args:
            if isinstance(a, TensorValue | NdarrayValue):
                kind = a.python_type().__name__
                raise unsupported("data_dependent_value", f"{fn.__name__}() of a {kind}")
        return literals.fold(fn, args, kwargs)

    return handler


for _fn in (int, float, str, round, divmod, pow, repr, format, chr, ord, complex, bytes, hash):
    _HANDLERS[_fn] = _scalar_handler(_fn)


def _operator_handler(sym: str) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if sym in dispatch.COMPARE:
            return dispatch.compare_op(tr, sym, args[0], args[1])
        return dispatch.binary_op(tr, sym, args[0], args[1])

    return handler


for _sym, _fn in [*dispatch.BINARY.items(), *dispatch.COMPARE.items()]:
    _HANDLERS[_fn] = _operator_handler(_sym)


@_handles(operator.getitem)
def _getitem(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return dispatch.get_item(tr, args[0], args[1])


@_handles(operator.setitem)
def _setitem_op(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    dispatch.set_item(tr, args[0], args[1], args[2])
    return ConstantValue(None)


def _unary_handler(name: str) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return dispatch.unary_op(tr, name, args[0])

    return handler


for _name in ("neg", "pos", "invert"):
    _HANDLERS[getattr(operator, _name)] = _unary_handler(_name)


@_handles(operator.not_)
def _not(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(not dispatch.truth(tr, args[0]))


@_handles(operator.truth)
def _truth_op(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(dispatch.truth(tr, args[0]))


@_handles(operator.is_)
def _is(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(operators.is_op(tr, args[0], args[1]))


@_handles(operator.is_not)
def _is_not(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(not operators.is_op(tr, args[0], args[1]))


@_handles(operator.contains)
def _contains(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(dispatch.contains(tr, args[1], args[0]))


@_handles(id)
def _id(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    v = args[0]
    if isinstance(v, ObjectValue):
        if v.source is not None:
            tr.out.guard(v.source, GuardKind.ID_MATCH, id(v.obj))
        return ConstantValue(id(v.obj))
    raise unsupported("unsupported_call", f"id() of {v}")


@_handles(inspect.signature)
def _signature(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn = args[0]
    bound = isinstance(fn, BoundMethodValue)
    target = fn.func if isinstance(fn, BoundMethodValue) else fn
    real = getattr(target, "real", None) or getattr(target, "obj", None)
    if real is None or kwargs:
        raise unsupported("unsupported_call", f"inspect.signature of {fn}")
    sig = inspect.signature(real)
    if bound:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    return ObjectValue(sig)


@_handles(callable)
def _callable(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    v = args[0]
    if isinstance(v, (ObjectValue, ConstantValue)):
        return ConstantValue(callable(v.obj if isinstance(v, ObjectValue) else v.value))
    return ConstantValue(
        not isinstance(v, (TensorValue, ListValue, TupleValue, DictValue, SetValue))
    )


@_handles(super)
def _super(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if len(args) == 2:
        return SuperValue(_types_of(args[0])[0], args[1])
    return tr.zero_arg_super()


@_handles(functools.partial)
def _partial(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    inner = args[0]
    if isinstance(inner, PartialValue):  # partial flattens a partial of a partial
        return PartialValue(inner.func, [*inner.args, *args[1:]], {**inner.kwargs, **kwargs})
    return PartialValue(inner, list(args[1:]), dict(kwargs))


@_handles(print)
def _print(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return literals.replay_call(tr, print, args, kwargs)


@_handles(warnings.warn)
def _warn(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    level = args[2] if len(args) > 2 else kwargs.get("stacklevel", ConstantValue(1))
    frame: Tracer | None = tr
    for _ in range(int(level.as_constant()) - 1):  # the frame the warning names
        frame = frame.parent if frame is not None else None
    if frame is None or "skip_file_prefixes" in kwargs:  # outside the capture
        return literals.replay_call(tr, warnings.warn, args, kwargs)
    where = (frame.code.co_filename, frame.lineno, frame.f_globals)
    return literals.replay_call(tr, functools.partial(side_effects.warn_at, where), args, kwargs)


@_handles(weakref.ref)
def _weakref(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if len(args) != 1 or kwargs:  # a callback runs when the referent dies
        raise unsupported("unsupported_call", "weakref.ref with a callback")
    target = args[0]
    if isinstance(target, ConstantValue):
        try:
            weakref.ref(target.value)
        except TypeError as e:
            raise raised(e) from e
    return WeakRefValue(target)


@dispatch.CALL.register(WeakRefValue)
def _call_weakref(
    tr: Tracer, fn: WeakRefValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    if args or kwargs:
        raise raised(TypeError("weakref.ReferenceType() takes no arguments"))
    return fn.target
