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
import itertools
import operator
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import (
    attributes,
    builtin_types,
    calls,
    copies,
    numpy_calls,
    operators,
    torch_calls,
)
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import (
    DictValue,
    DictViewValue,
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
from kiln.capture.values.objects import NewObjectValue, ObjectValue, SuperValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "fold",
    "handler_for",
    "is_literal",
    "iterate",
    "length",
    "literal",
    "make_dict",
    "unpack_iterable",
]

Handler = Callable[["Tracer", list[Value], dict[str, Value]], Value]
_HANDLERS: dict[Any, Handler] = {}


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


# iteration -------------------------------------------------------------------
def iterate(tr: Tracer, v: Value) -> IteratorValue:
    """``iter(v)``: an iterator the loop can unroll."""
    if isinstance(v, IteratorValue):
        return v
    own = builtin_types.call_override(tr, v, "__iter__", [])
    if own is not None:
        return iterate(tr, own)
    if isinstance(v, (ListValue, TupleValue, DictViewValue)):
        return ItemsIterator(list(v.items))
    if isinstance(v, DictValue):
        return ItemsIterator([k for k, _ in v.items.values()])
    if isinstance(v, SetValue):
        return ItemsIterator(v.ordered())
    if isinstance(v, ConstantValue):
        try:
            return ItemsIterator([ConstantValue(x) for x in v.value])
        except TypeError as e:
            raise unsupported("user_exception", str(e)) from e
    if isinstance(v, TensorValue):
        if v.fake.dim() == 0:
            raise unsupported("user_exception", "iteration over a 0-d tensor")
        n = v.fake.shape[0]
        return ItemsIterator([attributes.get_item(tr, v, ConstantValue(i)) for i in range(n)])
    if isinstance(v, ObjectValue):
        return _iterate_object(tr, v)
    if isinstance(v, NewObjectValue):
        method = attributes.get_attr(tr, v, "__iter__")
        result = calls.call(tr, method, [], {})
        return iterate(tr, result)
    raise unsupported("unsupported_operator", f"iter({v})")


def _iterate_object(tr: Tracer, v: ObjectValue) -> IteratorValue:
    obj = v.obj
    src = v.source
    guard_module_container(tr, v)
    if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
        return ItemsIterator(
            [
                wrap(tr.out, m, attributes.container_item_source(obj, src, i))
                for i, m in enumerate(obj)
            ]
        )
    if isinstance(obj, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
        return ItemsIterator([ConstantValue(k) for k in obj])
    if type(obj) in (dict, list, tuple, set, frozenset, range, str):
        return iterate(tr, wrap(tr.out, obj, src))
    items = builtin_types.snapshot(tr, v)  # a dict, list or tuple subclass
    if items is not None:
        return iterate(tr, items)
    method = attributes.get_attr(tr, v, "__iter__")
    return iterate(tr, calls.call(tr, method, [], {}))


_MODULE_SEQUENCES = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)
_MODULE_MAPPINGS = (torch.nn.ModuleDict, torch.nn.ParameterDict)


def guard_module_container(tr: Tracer, v: ObjectValue) -> None:
    """Unrolling a module container depends on its length or keys, not just its identity."""
    if v.source is None:
        return
    if isinstance(v.obj, _MODULE_SEQUENCES):
        tr.out.guard(v.source, GuardKind.SEQUENCE_LENGTH, len(v.obj))
    elif isinstance(v.obj, _MODULE_MAPPINGS):
        tr.out.guard(v.source, GuardKind.DICT_KEYS, tuple(v.obj.keys()))


def unpack_iterable(tr: Tracer, v: Value) -> list[Value]:
    """All items of a finite iterable."""
    it = iterate(tr, v)
    items: list[Value] = []
    while True:
        x = it.next(_caller(tr), _truth(tr))
        if x is None:
            return items
        items.append(x)
        if len(items) > 100_000:
            raise unsupported("inline_limit", "an iterable with over 100000 items")


def _caller(tr: Tracer) -> Callable[[Value, list[Value]], Value]:
    return lambda fn, args: calls.call(tr, fn, args, {})


def _truth(tr: Tracer) -> Callable[[Value], bool]:
    return lambda v: operators.truth(tr, v)


def length(tr: Tracer, v: Value) -> int:
    own = builtin_types.call_override(tr, v, "__len__", [])
    if own is not None:
        return int(own.as_constant())
    if isinstance(v, (ListValue, TupleValue)):
        return len(v.items)
    if isinstance(v, (DictValue, SetValue, DictViewValue)):
        return len(v.items)
    if isinstance(v, ConstantValue):
        return len(v.value)
    if isinstance(v, NdarrayValue):
        v = v.tensor  # numpy scalars have no len(): the 0-d check below raises for them too
    if isinstance(v, TensorValue):
        if v.fake.dim() == 0:
            raise unsupported("user_exception", "len() of a 0-d tensor")
        return int(v.fake.shape[0])
    if isinstance(v, ObjectValue) and (
        isinstance(v.obj, torch.nn.Module) or type(v.obj).__module__ == "builtins"
    ):
        guard_module_container(tr, v)
        return len(v.obj)
    method = attributes.get_attr(tr, v, "__len__")
    return int(calls.call(tr, method, [], {}).as_constant())


# builtins --------------------------------------------------------------------
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


def _all_literal(args: list[Value], kwargs: dict[str, Value]) -> bool:
    return all(is_literal(a) for a in [*args, *kwargs.values()])


@_handles(len)
def _len(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(length(tr, args[0]))


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
    if isinstance(v, (ObjectValue, ConstantValue)):
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
    if len(args) == 3 and not attributes.has_attr(tr, args[0], name):
        return args[2]
    return attributes.get_attr(tr, args[0], name)


@_handles(hasattr)
def _hasattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(attributes.has_attr(tr, args[0], args[1].as_constant()))


@_handles(setattr)
def _setattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    attributes.set_attr(tr, args[0], args[1].as_constant(), args[2])
    return ConstantValue(None)


@_handles(delattr)
def _delattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    attributes.delete_attr(tr, args[0], args[1].as_constant())
    return ConstantValue(None)


@_handles(object.__setattr__)
def _object_setattr(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    attributes.set_attr(tr, args[0], args[1].as_constant(), args[2], plain=True)
    return ConstantValue(None)


@_handles(object.__getattribute__)
def _object_getattribute(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    v, name = args[0], args[1].as_constant()
    if isinstance(v, ObjectValue):
        return attributes.plain_object_attr(tr, v, name)
    return attributes.get_attr(tr, v, name)


@_handles(object.__new__)
def _object_new(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    cls = _types_of(args[0])[0]
    return NewObjectValue(cls)


@_handles(range)
def _range(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return fold(range, args, kwargs)


@_handles(slice)
def _slice(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return fold(slice, args, kwargs)


@_handles(iter)
def _iter(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return iterate(tr, args[0])


@_handles(next)
def _next(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    it = args[0]
    if not isinstance(it, IteratorValue):
        raise unsupported("unsupported_operator", f"next({it})")
    item = it.next(_caller(tr), _truth(tr))
    if item is None:
        if len(args) == 2:
            return args[1]
        raise raised(StopIteration())
    return item


@_handles(enumerate)
def _enumerate(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    return EnumerateIterator(iterate(tr, args[0]), int(start.as_constant()))


@_handles(zip)
def _zip(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    strict = bool(kwargs["strict"].as_constant()) if "strict" in kwargs else False
    return ZipIterator([iterate(tr, a) for a in args], strict)


@_handles(map)
def _map(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return MapIterator(args[0], [iterate(tr, a) for a in args[1:]])


@_handles(filter)
def _filter(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn = None if isinstance(args[0], ConstantValue) and args[0].value is None else args[0]
    return MapIterator(fn, [iterate(tr, args[1])], keep=True)


@_handles(reversed)
def _reversed(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ItemsIterator(list(reversed(unpack_iterable(tr, args[0]))))


@_handles(list)
def _list(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ListValue(unpack_iterable(tr, args[0]) if args else [])


@_handles(tuple)
def _tuple(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return TupleValue(unpack_iterable(tr, args[0]) if args else [])


@_handles(set, frozenset)
def _set(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    items = unpack_iterable(tr, args[0]) if args else []
    return SetValue({dict_key(x): x for x in items})


def _dict_handler(cls: type) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return make_dict(tr, args, kwargs, cls)

    return handler


def make_dict(tr: Tracer, args: list[Value], kwargs: dict[str, Value], cls: type = dict) -> Value:
    out = DictValue({}, cls)
    if args:
        source = args[0]
        if isinstance(source, DictValue):
            out.items.update(source.items)
        else:
            for pair in unpack_iterable(tr, source):
                key, value = unpack_iterable(tr, pair)
                out.set(key, value)
    for name, kv in kwargs.items():
        out.set(ConstantValue(name), kv)
    return out


_HANDLERS[dict] = _dict_handler(dict)
_HANDLERS[copy.copy], _HANDLERS[copy.deepcopy] = copies.shallow_copy, copies.deep_copy
_HANDLERS[collections.OrderedDict] = _dict_handler(collections.OrderedDict)


def _sort_keys(tr: Tracer, items: list[Value], key: Value | None) -> list[Any]:
    """The constant sort key of each item (``key(item)`` inlined when given)."""
    keys = [item if key is None else calls.call(tr, key, [item], {}) for item in items]
    if not all(is_literal(k) for k in keys):
        raise unsupported("unsupported_call", "ordering values that are not constants")
    return [literal(k) for k in keys]


def _ordered(
    tr: Tracer, items: list[Value], kwargs: dict[str, Value]
) -> list[tuple[Any, int, Value]]:
    key = kwargs.get("key")
    key = None if isinstance(key, ConstantValue) and key.value is None else key
    keys = _sort_keys(tr, items, key)
    return [(k, i, item) for i, (k, item) in enumerate(zip(keys, items, strict=True))]


@_handles(sorted)
def _sorted(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    ordered = _ordered(tr, unpack_iterable(tr, args[0]), kwargs)
    reverse = bool(kwargs["reverse"].as_constant()) if "reverse" in kwargs else False
    try:
        ordered.sort(key=lambda e: e[0], reverse=reverse)
    except TypeError as e:
        raise raised(e) from e
    return ListValue([item for _, _, item in ordered])


@_handles(functools.reduce)
def _reduce(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    items = unpack_iterable(tr, args[1])
    if len(args) > 2:
        items = [args[2], *items]
    if not items:
        raise raised(TypeError("reduce() of empty iterable with no initial value"))
    total = items[0]
    for item in items[1:]:
        total = calls.call(tr, args[0], [total, item], {})
    return total


@_handles(itertools.chain)
def _chain(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ItemsIterator([x for a in args for x in unpack_iterable(tr, a)])


@_handles(itertools.product)
def _product(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    pools = [unpack_iterable(tr, a) for a in args]
    return ItemsIterator([TupleValue(list(p)) for p in itertools.product(*pools)])


def _min_max_handler(fn: Callable[..., Any]) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        items = args if len(args) > 1 else unpack_iterable(tr, args[0])
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
    items = unpack_iterable(tr, args[0])
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    for x in items:
        total = operators.binary_op(tr, "+", total, x)
    return total


@_handles(any)
def _any(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(any(operators.truth(tr, x) for x in unpack_iterable(tr, args[0])))


@_handles(all)
def _all(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(all(operators.truth(tr, x) for x in unpack_iterable(tr, args[0])))


@_handles(abs)
def _abs(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if isinstance(args[0], TensorValue):
        return torch_calls.call_function(tr, operator.abs, args, {})
    if isinstance(args[0], NdarrayValue):
        return numpy_calls.unary_op(tr, "abs", args[0])
    return fold(abs, args, kwargs)


@_handles(bool)
def _bool(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(operators.truth(tr, args[0]) if args else False)


def _scalar_handler(fn: Callable[..., Any]) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        for a in args:
            if isinstance(a, TensorValue | NdarrayValue):
                kind = a.python_type().__name__
                raise unsupported("data_dependent_value", f"{fn.__name__}() of a {kind}")
        return fold(fn, args, kwargs)

    return handler


for _fn in (int, float, str, round, divmod, pow, repr, format, chr, ord, complex, bytes, hash):
    _HANDLERS[_fn] = _scalar_handler(_fn)


def _operator_handler(sym: str) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if sym in operators.COMPARE:
            return operators.compare_op(tr, sym, args[0], args[1])
        return operators.binary_op(tr, sym, args[0], args[1])

    return handler


for _sym, _fn in [*operators.BINARY.items(), *operators.COMPARE.items()]:
    _HANDLERS[_fn] = _operator_handler(_sym)


@_handles(operator.getitem)
def _getitem(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return attributes.get_item(tr, args[0], args[1])


@_handles(operator.setitem)
def _setitem_op(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    attributes.set_item(tr, args[0], args[1], args[2])
    return ConstantValue(None)


def _unary_handler(name: str) -> Handler:
    def handler(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return operators.unary_op(tr, name, args[0])

    return handler


for _name in ("neg", "pos", "invert"):
    _HANDLERS[getattr(operator, _name)] = _unary_handler(_name)


@_handles(operator.not_)
def _not(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(not operators.truth(tr, args[0]))


@_handles(operator.truth)
def _truth_op(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(operators.truth(tr, args[0]))


@_handles(operator.is_)
def _is(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(operators.is_op(tr, args[0], args[1]))


@_handles(operator.is_not)
def _is_not(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(not operators.is_op(tr, args[0], args[1]))


@_handles(operator.contains)
def _contains(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(operators.contains(tr, args[1], args[0]))


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
    return calls.replay_call(tr, print, args, kwargs)


@_handles(warnings.warn)
def _warn(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return calls.replay_call(tr, warnings.warn, args, kwargs)
