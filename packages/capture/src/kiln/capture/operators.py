"""Python operators on tracked values: binary, in-place, comparison, unary, truth, ``in``.

Constants fold, containers follow Python's rules, and user objects' dunder methods are
inlined. Tensors' and ndarrays' operators are registered by ``torch_calls`` and ``numpy_calls``
with a higher priority, so they answer from either side (``2 * t`` is the tensor's).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from kiln.capture import builtin_types, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import (
    DictValue,
    DictViewValue,
    ListValue,
    SetValue,
    TupleValue,
    dict_key,
)
from kiln.capture.values.functions import UserFunctionValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import function_value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["binary_op", "compare_op", "is_op"]

_DUNDER = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
    "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift",
    ">>": "rshift", "<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge",
}  # fmt: skip
_REFLECTED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _fold(fn: Callable[[Any, Any], Any], a: Any, b: Any) -> Value:
    try:
        return ConstantValue(fn(a, b))
    except Exception as e:
        raise raised(e) from e


@dispatch.BINARY_OP.register(Value)
def binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    """``a <sym> b`` for a binary or in-place operator symbol such as ``+`` or ``+=``."""
    fn = dispatch.BINARY[sym]
    if isinstance(a, ConstantValue) and isinstance(b, ConstantValue):
        return _fold(fn, a.value, b.value)
    inplace = sym.endswith("=")
    base = sym[:-1] if inplace else sym
    seq = _sequence_op(base, a, b, inplace)
    if seq is None:
        seq = _set_op(base, a, b, inplace)
    if seq is not None:
        return seq
    return _dunder(tr, base, a, b, inplace)


def _sequence_op(sym: str, a: Value, b: Value, inplace: bool) -> Value | None:
    if sym == "+" and isinstance(a, ListValue) and isinstance(b, (ListValue, TupleValue)):
        if inplace:
            a.check_mutable()
            a.items.extend(b.items)
            return a
        if isinstance(b, ListValue):
            return ListValue([*a.items, *b.items])
    if sym == "+" and isinstance(a, TupleValue) and isinstance(b, TupleValue):
        return TupleValue([*a.items, *b.items])
    if sym == "+" and isinstance(a, TupleValue) and isinstance(b, ConstantValue):
        return TupleValue([*a.items, *(ConstantValue(x) for x in b.as_constant())])
    if sym == "+" and isinstance(a, ConstantValue) and isinstance(b, TupleValue):
        return TupleValue([*(ConstantValue(x) for x in a.as_constant()), *b.items])
    if sym == "*" and isinstance(a, (ListValue, TupleValue)) and isinstance(b, ConstantValue):
        items = a.items * int(b.value)
        return ListValue(items) if isinstance(a, ListValue) else TupleValue(items)
    if sym == "|" and isinstance(a, DictValue) and isinstance(b, DictValue):
        if inplace:
            a.check_mutable()
            a.items.update(b.items)
            return a
        return DictValue({**a.items, **b.items})
    return None


_SET_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "|": operator.or_,
    "&": operator.and_,
    "-": operator.sub,
    "^": operator.xor,
}


def _set_keys(v: Value) -> dict[Any, Value] | None:
    """The elements of a set, a keys or items view, or a constant set, by hashable key."""
    if isinstance(v, SetValue):
        return v.items
    if isinstance(v, DictViewValue) and v.kind != "values":
        return {_pair_key(x): x for x in v.items}
    if isinstance(v, ConstantValue) and isinstance(v.value, (set, frozenset)):
        return {x: ConstantValue(x) for x in v.value}
    return None


def _pair_key(v: Value) -> Any:
    if isinstance(v, TupleValue):
        return tuple(_pair_key(x) for x in v.items)
    return dict_key(v)


def _set_op(sym: str, a: Value, b: Value, inplace: bool) -> Value | None:
    """``|``, ``&``, ``-``, ``^`` of sets and dict views (the result is a new set)."""
    fn = _SET_OPS.get(sym)
    left, right = _set_keys(a), _set_keys(b)
    if fn is None or left is None or right is None:
        return None
    keys = fn(left.keys(), right.keys())
    picked = {k: left[k] if k in left else right[k] for k in [*left, *right] if k in keys}
    if inplace and isinstance(a, SetValue):
        a.check_mutable()
        a.items = picked
        return a
    return SetValue(picked)


def _dunder(tr: Tracer, sym: str, a: Value, b: Value, inplace: bool) -> Value:
    name = _DUNDER.get(sym)
    if name is not None:
        names = [f"__i{name}__"] if inplace else []
        names.append(f"__{name}__")
        for n in names:
            method = _user_method(a, n)
            if method is not None:
                result = dispatch.call(tr, method, [a, b], {})
                if not (isinstance(result, ConstantValue) and result.value is NotImplemented):
                    return result
        reflected = _REFLECTED.get(name, f"r{name}")
        method = _user_method(b, f"__{reflected}__")
        if method is not None:
            return dispatch.call(tr, method, [b, a], {})
    if sym in ("==", "!="):
        same = _identity(a, b)
        if same is not None:
            return ConstantValue(same == (sym == "=="))
    raise unsupported(
        "unsupported_operator", f"{a.python_type().__name__} {sym} {b.python_type().__name__}"
    )


def _user_method(v: Value, name: str) -> Value | None:
    """A Python-level dunder defined by ``v``'s class, as an unbound function value."""
    cls = v.python_type()
    if not isinstance(v, (NewObjectValue, ObjectValue)):
        return None
    for klass in cls.__mro__:
        if name in klass.__dict__:
            fn = klass.__dict__[name]
            return function_value(fn, None) if hasattr(fn, "__code__") else None
    return None


def _identity(a: Value, b: Value) -> bool | None:
    if a is b:
        return True
    oa, ob = getattr(a, "obj", None), getattr(b, "obj", None)
    if oa is not None and ob is not None:
        return oa is ob
    if isinstance(a, ConstantValue) and isinstance(b, ConstantValue):
        return a.value is b.value
    tracked = (ListValue, DictValue, SetValue, NewObjectValue, UserFunctionValue, TensorValue)
    if isinstance(a, tracked) or isinstance(b, tracked):
        if isinstance(a, TensorValue) and isinstance(b, TensorValue):
            if a.node is not b.node and a.node.op == b.node.op == "placeholder":
                # two inputs may or may not be one tensor, and guards do not check which
                raise unsupported("unsupported_operator", "identity of two input tensors")
            # an in-place op makes a new node but returns the same (fake) tensor
            return a.fake is b.fake
        if isinstance(a, ConstantValue) or isinstance(b, ConstantValue):
            return False
        return a is b if type(a) is type(b) else False
    return None


@dispatch.COMPARE_OP.register(Value)
def compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    fn = dispatch.COMPARE[sym]
    if isinstance(a, ConstantValue) and isinstance(b, ConstantValue):
        return _fold(fn, a.value, b.value)
    if (
        isinstance(a, (ListValue, TupleValue))
        and isinstance(b, (ListValue, TupleValue))
        and sym in ("==", "!=")
    ):
        equal = len(a.items) == len(b.items) and all(
            dispatch.truth(tr, compare_op(tr, "==", x, y))
            for x, y in zip(a.items, b.items, strict=False)
        )
        return ConstantValue(equal == (sym == "=="))
    if isinstance(a, TupleValue) and isinstance(b, ConstantValue) and isinstance(b.value, tuple):
        return compare_op(tr, sym, a, TupleValue([ConstantValue(x) for x in b.value]))
    if isinstance(b, TupleValue) and isinstance(a, ConstantValue) and isinstance(a.value, tuple):
        return compare_op(tr, sym, TupleValue([ConstantValue(x) for x in a.value]), b)
    left, right = _set_keys(a), _set_keys(b)
    if left is not None and right is not None and sym in ("==", "!="):
        return ConstantValue((left.keys() == right.keys()) == (sym == "=="))
    if isinstance(a, ObjectValue) and isinstance(b, ObjectValue) and sym in ("==", "!="):
        eq_type: Any = type(a.obj).__eq__
        if eq_type is object.__eq__ or isinstance(a.obj, type):
            _guard_identity(tr, a, b)
            return ConstantValue((a.obj is b.obj) == (sym == "=="))
    return _dunder(tr, sym, a, b, False)


def is_op(tr: Tracer, a: Value, b: Value) -> bool:
    """``a is b``; identities of real objects are guarded (ID_MATCH), as the answer depends on them."""
    same = _identity(a, b)
    if same is None:
        raise unsupported("unsupported_operator", f"{a} is {b}")
    _guard_identity(tr, a, b)
    return same


def _guard_identity(tr: Tracer, *values: Value) -> None:
    for v in values:
        if isinstance(v, ObjectValue) and v.source is not None:
            tr.out.guard(v.source, GuardKind.ID_MATCH, id(v.obj))


# ``item in container`` by the container's kind; a container subclass's own Python
# ``__contains__`` runs first.
@dispatch.CONTAINS.register(Value)
def _contains(tr: Tracer, item: Value, container: Value) -> bool:
    own = builtin_types.call_override(tr, container, "__contains__", [item])
    if own is not None:
        return dispatch.truth(tr, own)
    return _builtin_contains(tr, item, container)


@dispatch.CONTAINS.register(ObjectValue)
def _object_contains(tr: Tracer, item: Value, container: ObjectValue) -> bool:
    snapshot = builtin_types.snapshot(tr, container)  # a dict, list or tuple subclass
    if snapshot is not None:
        return _builtin_contains(tr, item, snapshot)
    obj = container.obj
    if (
        isinstance(item, ConstantValue)
        and isinstance(obj, (frozenset, set, dict))
        and container.source is None
    ):
        return item.value in obj
    return _user_contains(tr, item, container)


@dispatch.CONTAINS.register(NewObjectValue)
def _user_contains(tr: Tracer, item: Value, container: Value) -> bool:
    method = _user_method(container, "__contains__")
    if method is None:
        raise unsupported("unsupported_operator", f"in {container}")
    return dispatch.truth(tr, dispatch.call(tr, method, [container, item], {}))


def _builtin_contains(tr: Tracer, item: Value, container: Value) -> bool:
    """``in`` as the builtin containers answer it (subclass overrides already ruled out)."""
    if isinstance(container, ConstantValue) and isinstance(item, ConstantValue):
        try:
            return item.value in container.value
        except TypeError as e:
            raise unsupported("user_exception", str(e)) from e
    if isinstance(container, (DictValue, SetValue)):
        return dict_key(item) in container.items
    keys = _set_keys(container)
    if keys is not None:  # a keys or items view, a constant set
        return _pair_key(item) in keys
    if isinstance(container, (ListValue, TupleValue, DictViewValue)):
        return any(
            _identity(item, x) or dispatch.truth(tr, compare_op(tr, "==", item, x))
            for x in container.items
        )
    raise unsupported("unsupported_operator", f"in {container}")


# ``bool(v)`` by kind; tensors and ndarrays refuse (torch_calls and numpy_calls register that).
@dispatch.TRUTH.register(Value)
def _truth(tr: Tracer, v: Value) -> bool:
    """Functions, methods, iterators: true (a container subclass may say otherwise)."""
    own = _own_truth(tr, v)
    return True if own is None else own


def _own_truth(tr: Tracer, v: Value) -> bool | None:
    """The answer of a Python ``__bool__`` or ``__len__`` a container subclass defines."""
    for name in ("__bool__", "__len__"):
        own = builtin_types.call_override(tr, v, name, [])
        if own is not None:
            return dispatch.truth(tr, own) if name == "__bool__" else bool(own.as_constant())
    return None


@dispatch.TRUTH.register(ConstantValue)
def _constant_truth(tr: Tracer, v: ConstantValue) -> bool:
    return bool(v.value)


@dispatch.TRUTH.register(ListValue, TupleValue, DictValue, SetValue, DictViewValue)
def _container_truth(
    tr: Tracer, v: ListValue | TupleValue | DictValue | SetValue | DictViewValue
) -> bool:
    own = _own_truth(tr, v)
    return bool(v.items) if own is None else own


@dispatch.TRUTH.register(NewObjectValue)
def _new_object_truth(tr: Tracer, v: NewObjectValue) -> bool:
    found = _user_truth(tr, v)
    return True if found is None else found


@dispatch.TRUTH.register(ObjectValue)
def _object_value_truth(tr: Tracer, v: ObjectValue) -> bool:
    found = _user_truth(tr, v)
    return _object_truth(v.obj) if found is None else found


def _user_truth(tr: Tracer, v: NewObjectValue | ObjectValue) -> bool | None:
    for name in ("__bool__", "__len__"):
        method = _user_method(v, name)
        if method is not None:
            result = dispatch.call(tr, method, [v], {})
            return dispatch.truth(tr, result) if name == "__bool__" else bool(result.as_constant())
    return None


def _object_truth(obj: object) -> bool:
    cls = type(obj)
    if isinstance(obj, type) or (
        getattr(cls, "__bool__", None) is None and getattr(cls, "__len__", None) is None
    ):
        return True
    if isinstance(obj, (nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.ParameterList)):
        return len(obj) > 0
    if cls.__module__ == "builtins":
        return bool(obj)
    raise unsupported("unsupported_operator", f"bool() of a {cls.__name__}")


# ``-v``, ``+v``, ``~v`` by kind (``name`` is ``neg``, ``pos`` or ``invert``); tensors' and
# ndarrays' are registered by torch_calls and numpy_calls.
@dispatch.UNARY_OP.register(Value)
def _user_unary_op(tr: Tracer, name: str, v: Value) -> Value:
    method = _user_method(v, f"__{name}__")
    if method is not None:
        return dispatch.call(tr, method, [v], {})
    raise unsupported("unsupported_operator", f"{name} {v}")


@dispatch.UNARY_OP.register(ConstantValue)
def _constant_unary_op(tr: Tracer, name: str, v: ConstantValue) -> Value:
    try:
        return ConstantValue(getattr(operator, name)(v.value))
    except Exception as e:
        raise unsupported("user_exception", str(e)) from e
