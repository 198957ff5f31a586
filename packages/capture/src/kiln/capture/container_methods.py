"""Methods of tracked lists, tuples, dicts and sets (``lst.append``, ``d.items()``).

Containers made during tracing are updated in place; containers from the
frame are marked mutated and written back by the emitted code.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from kiln.capture import dispatch, literals
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import (
    DictValue,
    DictViewValue,
    ListValue,
    SetValue,
    TupleValue,
    dict_key,
)
from kiln.capture.values.functions import BuiltinMethodValue

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["make_dict"]


# ``receiver.name(*args)`` by the receiver's kind (a list's, dict's, set's or tuple's own
# method, not a subclass's override); ndarrays' are registered by numpy_calls.
@dispatch.CALL_METHOD.register(Value)
def _no_method(
    tr: Tracer, receiver: Value, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    raise unsupported("unsupported_call", f"{receiver.python_type().__name__}.{name}")


@dispatch.CALL_METHOD.register(TupleValue)
def _tuple_method(
    tr: Tracer, receiver: TupleValue, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    if name in ("index", "count"):
        return literals.fold(getattr(tuple, name), [TupleValue(receiver.items), *args], {})
    if name == "__getitem__":  # the tuple's own
        return dispatch.get_item(tr, TupleValue(receiver.items), args[0])
    if name == "__contains__":
        return ConstantValue(dispatch.contains(tr, args[0], TupleValue(receiver.items)))
    return _no_method(tr, receiver, name, args, kwargs)


@dispatch.CALL_METHOD.register(ListValue)
def _list_method(
    tr: Tracer, lst: ListValue, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    if name in ("index", "count", "copy", "__len__", "__getitem__", "__contains__"):
        if name == "copy":
            return ListValue(list(lst.items))
        if name == "__getitem__":  # the list's own item access, not a subclass's override
            return dispatch.get_item(tr, ListValue(lst.items), args[0])
        if name == "__len__":
            return ConstantValue(len(lst.items))
        if name == "__contains__":
            return ConstantValue(dispatch.contains(tr, args[0], lst))
        return literals.fold(getattr(list, name), [ListValue(lst.items), *args], {})
    lst.check_mutable()
    if name == "append":
        lst.items.append(args[0])
    elif name == "extend":
        lst.items.extend(dispatch.unpack_iterable(tr, args[0]))
    elif name == "insert":
        lst.items.insert(int(args[0].as_constant()), args[1])
    elif name == "pop":
        return lst.items.pop(int(args[0].as_constant()) if args else -1)
    elif name == "clear":
        lst.items.clear()
    elif name == "reverse":
        lst.items.reverse()
    elif name == "remove":
        for i, x in enumerate(lst.items):
            if dispatch.truth(tr, dispatch.compare_op(tr, "==", x, args[0])):
                del lst.items[i]
                break
    elif name == "__setitem__":
        dispatch.set_item(tr, ListValue(lst.items), args[0], args[1])
    elif name == "sort" and not args:
        _sort(tr, lst, kwargs)
    else:
        raise unsupported("unsupported_call", f"list.{name}")
    return ConstantValue(None)


def _sort(tr: Tracer, lst: ListValue, kwargs: dict[str, Value]) -> None:
    """``lst.sort(key=..., reverse=...)`` where every key is a constant (stable, as Python's)."""
    key = kwargs.get("key")
    if key is not None and isinstance(key, ConstantValue) and key.is_none():
        key = None
    keys = [
        literals.literal(dispatch.call(tr, key, [x], {}) if key is not None else x)
        for x in lst.items
    ]
    reverse = bool(kwargs.get("reverse", ConstantValue(False)).as_constant())
    try:
        order = sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)
    except TypeError as e:
        raise raised(e) from e
    lst.items[:] = [lst.items[i] for i in order]


@dispatch.CALL_METHOD.register(DictValue)
def _dict_method(
    tr: Tracer, d: DictValue, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    if name in ("keys", "values", "items"):
        return DictViewValue(d, name)
    if name in ("get", "__getitem__"):
        found = d.get(args[0])
        if found is None:
            if name == "__getitem__":
                raise raised(KeyError(dict_key(args[0])))
            return args[1] if len(args) > 1 else ConstantValue(None)
        return found
    if name == "__contains__":
        return ConstantValue(dict_key(args[0]) in d.items)
    if name == "copy":  # dict's makes a plain dict; OrderedDict's, one of the same class
        ordered = issubclass(d.cls, collections.OrderedDict)
        return DictValue(dict(d.items), d.cls if ordered else dict)
    if name == "__len__":
        return ConstantValue(len(d.items))
    if name == "to_tuple":
        return TupleValue([v for _, v in d.items.values()])
    d.check_mutable()
    if name in ("__setitem__",):
        d.set(args[0], args[1])
    elif name == "pop":
        popped = d.items.pop(dict_key(args[0]), None)
        if popped is None:
            if len(args) > 1:
                return args[1]
            raise raised(KeyError(dict_key(args[0])))
        return popped[1]
    elif name == "setdefault":
        found_v = d.get(args[0])
        if found_v is not None:
            return found_v
        d.set(args[0], args[1] if len(args) > 1 else ConstantValue(None))
        return args[1] if len(args) > 1 else ConstantValue(None)
    elif name == "update":
        if args:
            other = make_dict(tr, [args[0]], {})
            assert isinstance(other, DictValue)
            d.items.update(other.items)
        for k, v in kwargs.items():
            d.set(ConstantValue(k), v)
    elif name == "clear":
        d.items.clear()
    elif name in ("popitem", "move_to_end"):
        return _reorder(d, name, args, kwargs)
    else:
        raise unsupported("unsupported_call", f"dict.{name}")
    return ConstantValue(None)


def _reorder(d: DictValue, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``d.popitem(last=True)`` (a plain dict's takes the last) and ``od.move_to_end(k, last)``."""
    flag = args[-1] if len(args) > (name == "move_to_end") else kwargs.get("last")
    last = bool(flag.as_constant()) if flag is not None else True
    if name == "popitem":
        if not d.items:
            raise raised(KeyError("popitem(): dictionary is empty"))
        key = next(reversed(d.items)) if last else next(iter(d.items))
        return TupleValue(list(d.items.pop(key)))
    key = dict_key(args[0])
    if key not in d.items:
        raise raised(KeyError(key))
    entry = d.items.pop(key)
    rest = list(d.items.items())
    if not last:
        d.items.clear()
    d.items[key] = entry
    d.items.update(rest if not last else [])
    return ConstantValue(None)


_SET_ALGEBRA = {"union": "|", "intersection": "&", "difference": "-", "symmetric_difference": "^"}
_SET_RELATIONS = {"issubset": "<=", "issuperset": ">=", "isdisjoint": "isdisjoint"}


def _as_set(tr: Tracer, v: Value) -> SetValue:
    if isinstance(v, SetValue):
        return v
    return SetValue({dict_key(x): x for x in dispatch.unpack_iterable(tr, v)})


@dispatch.CALL_METHOD.register(SetValue)
def _set_method(
    tr: Tracer, s: SetValue, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    if name == "__contains__":
        return ConstantValue(dict_key(args[0]) in s.items)
    if name == "copy":
        return SetValue(dict(s.items))
    if name in _SET_ALGEBRA:  # ``s.union(a, b)`` takes any iterables
        result: Value = SetValue(dict(s.items))
        for other in args:
            result = dispatch.binary_op(tr, _SET_ALGEBRA[name], result, _as_set(tr, other))
        return result
    if name in _SET_RELATIONS:
        mine, theirs = s.items.keys(), _as_set(tr, args[0]).items.keys()
        if name == "isdisjoint":
            return ConstantValue(mine.isdisjoint(theirs))
        return ConstantValue(mine <= theirs if name == "issubset" else mine >= theirs)
    s.check_mutable()
    if name == "add":
        s.items[dict_key(args[0])] = args[0]
    elif name == "update":
        for x in dispatch.unpack_iterable(tr, args[0]):
            s.items[dict_key(x)] = x
    elif name.endswith("_update") and name[: -len("_update")] in _SET_ALGEBRA:
        updated = _set_method(tr, s, name[: -len("_update")], args, {})
        assert isinstance(updated, SetValue)
        s.items = updated.items
    elif name == "discard" or (name == "remove" and dict_key(args[0]) in s.items):
        s.items.pop(dict_key(args[0]), None)
    elif name == "remove":
        raise raised(KeyError(dict_key(args[0])))
    elif name == "clear":
        s.items.clear()
    else:
        raise unsupported("unsupported_call", f"set.{name}")
    return ConstantValue(None)


def make_dict(tr: Tracer, args: list[Value], kwargs: dict[str, Value], cls: type = dict) -> Value:
    out = DictValue({}, cls)
    if args:
        source = args[0]
        if isinstance(source, DictValue):
            out.items.update(source.items)
        else:
            for pair in dispatch.unpack_iterable(tr, source):
                key, value = dispatch.unpack_iterable(tr, pair)
                out.set(key, value)
    for name, kv in kwargs.items():
        out.set(ConstantValue(name), kv)
    return out


@dispatch.CALL.register(BuiltinMethodValue)
def _call_builtin_method(
    tr: Tracer, fn: BuiltinMethodValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    return dispatch.call_method(tr, fn.receiver, fn.name, args, kwargs)
