"""Python operators on tracked values: binary, in-place, comparison, unary, truth, ``in``.

Each kind registers what it answers: constants fold, lists and tuples concatenate, repeat and
compare item by item, dicts merge and compare by keys and values, sets and dict views combine
and compare as sets, user objects' dunder methods are inlined (a container subclass's own
operator is a graph break, so Python runs it). A binary or comparison handler returns None for an operand
pair it does not know, and the other operand's kind is asked next (see
:mod:`~kiln.capture.dispatch`); the general handler, registered for ``Value``, answers ``==``
and ``!=`` by identity, as ``object.__eq__`` does, and refuses the rest. Tensors' and ndarrays'
operators are registered by ``torch_calls`` and ``numpy_calls`` with a higher priority, so they
answer from either side (``2 * t`` is the tensor's).
"""

from __future__ import annotations

import collections
import inspect
import operator
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kiln.capture import builtin_types, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.errors import Unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.literals import refuse_by_type
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
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import function_value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["is_op"]

_DUNDER = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
    "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift",
    ">>": "rshift", "<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge",
}  # fmt: skip
_REFLECTED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_EQUALITY = ("==", "!=")
# ``in`` asks ``__contains__``, else iterates, else indexes from 0
_MEMBERSHIP = ("__contains__", "__iter__", "__getitem__")


def _split(sym: str) -> tuple[str, bool]:
    """An operator symbol without its ``=`` and whether it had one (``+=`` is ``+``, in place)."""
    return (sym[:-1], True) if sym.endswith("=") else (sym, False)


def _refusal(a: Value, sym: str, b: Value) -> Unsupported:
    return unsupported(
        "unsupported_operator", f"{a.python_type().__name__} {sym} {b.python_type().__name__}"
    )


# binary and in-place operators -------------------------------------------------------------
@dispatch.BINARY_OP.register(Value)
def _no_binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    raise _refusal(a, sym, b)


@dispatch.BINARY_OP.register(ConstantValue)
@dispatch.COMPARE_OP.register(ConstantValue)
def _constant_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """Two constants fold (an error is the program's, raised where it runs)."""
    if not (isinstance(a, ConstantValue) and isinstance(b, ConstantValue)):
        return None
    fn = dispatch.BINARY[sym] if sym in dispatch.BINARY else dispatch.COMPARE[sym]
    try:
        return ConstantValue(fn(a.value, b.value))
    except Exception as e:
        raise raised(e) from e


@dispatch.BINARY_OP.register(ListValue, TupleValue)
def _sequence_binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """``+`` joins two lists or two tuples (``+=`` extends a list by either); ``*`` repeats."""
    base, inplace = _split(sym)
    _refuse_overrides(tr, base, a, b)
    left, right = _sequence(a), _sequence(b)
    if left is None:
        return None
    if base == "*" and isinstance(b, ConstantValue) and isinstance(b.value, int):
        if inplace and isinstance(left, ListValue):
            left.check_mutable()
            left.items *= b.value
            return left
        return _joined(left.items * b.value, a, b)
    if base != "+" or right is None:
        return None
    if inplace and isinstance(left, ListValue):
        left.check_mutable()
        left.items.extend(right.items)
        return left
    return _joined([*left.items, *right.items], a, b) if type(left) is type(right) else None


def _joined(items: list[Value], a: Value, b: Value) -> ListValue | TupleValue:
    """A new list, or a tuple: a ``torch.Size`` where either operand is one, as its operators
    return (a named tuple's give a plain tuple)."""
    if isinstance(a, ListValue):
        return ListValue(items)
    sized = any(issubclass(v.python_type(), torch.Size) for v in (a, b))
    return TupleValue(items, torch.Size if sized else tuple)


def _sequence(v: Value) -> ListValue | TupleValue | None:
    """A list, a tuple or a constant tuple as a tracked sequence."""
    if isinstance(v, (ListValue, TupleValue)):
        return v
    if isinstance(v, ConstantValue) and isinstance(v.value, tuple):
        return TupleValue([ConstantValue(x) for x in v.value])
    return None


@dispatch.BINARY_OP.register(DictValue)
def _dict_binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """``d | e`` and ``d |= e`` of two dicts."""
    base, inplace = _split(sym)
    _refuse_overrides(tr, base, a, b)
    if base != "|" or not (isinstance(a, DictValue) and isinstance(b, DictValue)):
        return None
    if inplace:
        a.check_mutable()
        a.items.update(b.items)
        return a
    # ``dict.__or__`` makes a plain dict; ``OrderedDict``'s (and ``__ror__``) its own class,
    # which a subclass of it would have to construct
    ordered = [cls for cls in (a.cls, b.cls) if issubclass(cls, collections.OrderedDict)]
    if any(cls is not collections.OrderedDict for cls in ordered):
        return None
    return DictValue({**a.items, **b.items}, collections.OrderedDict if ordered else dict)


_SET_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "|": operator.or_,
    "&": operator.and_,
    "-": operator.sub,
    "^": operator.xor,
}


@dispatch.BINARY_OP.register(SetValue, DictViewValue)
def _set_binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """``|``, ``&``, ``-``, ``^`` of sets, dict views and constant sets (the result is a set)."""
    base, inplace = _split(sym)
    _refuse_overrides(tr, base, a, b)
    fn = _SET_OPS.get(base)
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


@dispatch.BINARY_OP.register(NewObjectValue, ObjectValue)
def _user_binary_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    base, inplace = _split(sym)
    left, right = _annotation(a), _annotation(b)
    if base == "|" and left is not _NOT_ANNOTATION and right is not _NOT_ANNOTATION:
        # ``Callable[[T], bool] | None``: an annotation a nested ``def`` evaluates as it runs
        # (torch's pytree helpers); building the union has no effect, so it folds
        return ObjectValue(left | right)
    return _dunder(tr, base, a, b, inplace)


_NOT_ANNOTATION = object()
_TYPING_MODULES = frozenset({"typing", "types", "_collections_abc", "collections.abc"})


def _annotation(v: Value) -> Any:
    """The class or typing form ``v`` holds (None for None), else ``_NOT_ANNOTATION``; a
    class whose metaclass has its own ``|`` is not one (that may be the program's code)."""
    if isinstance(v, ConstantValue) and v.is_none():
        return None
    if not isinstance(v, ObjectValue):
        return _NOT_ANNOTATION
    meta: Any = type(v.obj)
    if isinstance(v.obj, type) and meta.__or__ is type.__or__ and meta.__ror__ is type.__ror__:
        return v.obj
    if meta.__module__ in _TYPING_MODULES:
        return v.obj
    return _NOT_ANNOTATION


def _dunder(tr: Tracer, sym: str, a: Value, b: Value, inplace: bool) -> Value | None:
    """Python's protocol over the operands' Python-level dunders: ``a.__iop__``, then
    ``a.__op__`` and ``b.__rop__`` (the reflected one first where ``b``'s class is a subclass
    of ``a``'s that overrides it, any subclass for a comparison), each while the last returned
    NotImplemented; None when none answers."""
    name = _DUNDER.get(sym)
    if name is None:
        return None
    if inplace:
        result = _call_dunder(tr, a, f"__i{name}__", b)
        if result is not None:
            return result
    compare = name in _REFLECTED
    reflected = f"__{_REFLECTED[name] if compare else f'r{name}'}__"
    order = [(a, f"__{name}__", b), (b, reflected, a)]
    if _reflected_first(a.python_type(), b.python_type(), reflected, compare):
        order.reverse()
    for v, method, other in order:
        result = _call_dunder(tr, v, method, other)
        if result is not None:
            return result
    return None


def _reflected_first(left: type, right: type, reflected: str, compare: bool) -> bool:
    if left is right or not issubclass(right, left):
        return False
    overridden = inspect.getattr_static(right, reflected, None)
    return compare or overridden is not inspect.getattr_static(left, reflected, None)


def _call_dunder(tr: Tracer, v: Value, name: str, other: Value) -> Value | None:
    """``v.name(other)`` for a user object's Python-level dunder; None where it has none or it
    returns NotImplemented. A class without its own ``__ne__`` inverts its ``__eq__``, as
    ``object.__ne__`` does."""
    method = _user_method(v, name)
    if method is None:
        if name != "__ne__" or inspect.getattr_static(v.python_type(), name) is not object.__ne__:
            return None
        equal = _call_dunder(tr, v, "__eq__", other)
        return None if equal is None else ConstantValue(not dispatch.truth(tr, equal))
    result = dispatch.call(tr, method, [v, other], {})
    return None if isinstance(result, ConstantValue) and result.value is NotImplemented else result


def _user_method(v: Value, name: str) -> Value | None:
    """A Python-level dunder defined by the class of a user object, as an unbound function."""
    if not isinstance(v, (NewObjectValue, ObjectValue)):
        return None
    for klass in v.python_type().__mro__:
        if name in klass.__dict__:
            fn = klass.__dict__[name]
            return function_value(fn, None) if hasattr(fn, "__code__") else None
    return None


def _refuse_overrides(tr: Tracer, sym: str, a: Value, b: Value) -> None:
    """A container subclass's own Python dunder for ``sym`` (forward, in-place or reflected)
    is not inlined: the graph breaks before the operator and Python runs it."""
    name = _DUNDER[sym]
    names = (f"__{name}__", f"__i{name}__", f"__{_REFLECTED.get(name, f'r{name}')}__")
    for v in (a, b):
        if any(builtin_types.python_method(tr, v, n) is not None for n in names):
            raise unsupported("unsupported_operator", f"{v.python_type().__name__}'s own {sym}")


# comparisons --------------------------------------------------------------------------------
@dispatch.COMPARE_OP.register(Value)
def _identity_compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value:
    """``==`` and ``!=`` by identity where capture knows it; other comparisons break."""
    if sym in _EQUALITY:
        same = _identity(a, b)
        if same is not None:
            return ConstantValue(same == (sym == "=="))
    raise _refusal(a, sym, b)


@dispatch.COMPARE_OP.register(ListValue, TupleValue)
def _sequence_compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """Lists equal lists and tuples equal tuples item by item; a list never equals a tuple,
    nor a constant of another type."""
    _refuse_overrides(tr, sym, a, b)
    left, right = _sequence(a), _sequence(b)
    if sym not in _EQUALITY:
        return None
    if left is None or right is None:
        other = a if left is None else b
        return ConstantValue(sym == "!=") if isinstance(other, ConstantValue) else None
    if type(left) is not type(right):
        return None
    equal = len(left.items) == len(right.items) and all(
        _equal(tr, x, y) for x, y in zip(left.items, right.items, strict=False)
    )
    return ConstantValue(equal == (sym == "=="))


@dispatch.COMPARE_OP.register(DictValue)
def _dict_compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """Dicts equal with the same keys and equal values (in the same order for two
    ``OrderedDict``s)."""
    _refuse_overrides(tr, sym, a, b)
    if sym not in _EQUALITY or not (isinstance(a, DictValue) and isinstance(b, DictValue)):
        return None
    ordered = all(issubclass(d.cls, collections.OrderedDict) for d in (a, b))
    keys = list(a.items) == list(b.items) if ordered else a.items.keys() == b.items.keys()
    equal = keys and all(_equal(tr, x, b.items[k][1]) for k, (_, x) in a.items.items())
    return ConstantValue(equal == (sym == "=="))


def _equal(tr: Tracer, a: Value, b: Value) -> bool:
    """``a == b`` as containers compare their items: identity first, as Python does."""
    return bool(_identity(a, b)) or dispatch.truth(tr, dispatch.compare_op(tr, "==", a, b))


@dispatch.COMPARE_OP.register(SetValue, DictViewValue)
def _set_compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    _refuse_overrides(tr, sym, a, b)
    left, right = _set_keys(a), _set_keys(b)
    if left is None or right is None or sym not in _EQUALITY:
        return None
    return ConstantValue((left.keys() == right.keys()) == (sym == "=="))


@dispatch.COMPARE_OP.register(NewObjectValue, ObjectValue)
def _user_compare_op(tr: Tracer, sym: str, a: Value, b: Value) -> Value | None:
    """Real objects without their own ``__eq__`` (and classes) equal by identity, guarded."""
    if isinstance(a, ObjectValue) and isinstance(b, ObjectValue) and sym in _EQUALITY:
        eq_type: Any = type(a.obj).__eq__
        if eq_type is object.__eq__ or isinstance(a.obj, type):
            _guard_identity(tr, a, b)
            return ConstantValue((a.obj is b.obj) == (sym == "=="))
    return _dunder(tr, sym, a, b, False)


def _identity(a: Value, b: Value) -> bool | None:
    if a is b:
        return True
    for x, y in ((a, b), (b, a)):  # a size is never None, a type, a function ...
        if isinstance(x, SymValue) and not isinstance(y, SymValue):
            plain = y.value if isinstance(y, ConstantValue) else None
            if not isinstance(plain, (int, float)):
                return False
    oa, ob = getattr(a, "obj", None), getattr(b, "obj", None)
    if oa is not None and ob is not None:
        return oa is ob
    if isinstance(a, ObjectValue) and isinstance(b, ConstantValue):
        return a.obj is b.value
    if isinstance(b, ObjectValue) and isinstance(a, ConstantValue):
        return b.obj is a.value
    if isinstance(a, ConstantValue) and isinstance(b, ConstantValue):
        return a.value is b.value
    fa, fb = _real_function(a), _real_function(b)
    if fa is not None and fb is not None:  # one function read through two paths (A.f, Base.f)
        return fa is fb
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


def _real_function(v: Value) -> types.FunctionType | None:
    """The real Python function ``v`` stands for, if any (None for one made in the trace)."""
    if isinstance(v, UserFunctionValue):
        return v.real
    obj = getattr(v, "obj", None)
    return obj if isinstance(obj, types.FunctionType) else None


def is_op(tr: Tracer, a: Value, b: Value) -> bool:
    """``a is b``; identities of real objects are guarded (ID_MATCH), as the answer depends on them."""
    parameters = _parameter_identity(tr, a, b)
    if parameters is not None:
        return parameters
    same = _identity(a, b)
    if same is None:
        raise unsupported("unsupported_operator", f"{a} is {b}")
    if not isinstance(a, ConstantValue) and not isinstance(b, ConstantValue):
        # an object from the frame has its type guarded, which settles ``obj is None``
        _guard_identity(tr, a, b)
    return same


def _parameter_identity(tr: Tracer, a: Value, b: Value) -> bool | None:
    """Whether two input tensors that are both parameters are one object, or None for other
    values. Each is pinned by identity (ID_MATCH): a parameter stays the same object from call
    to call, and code compares parameters to see whether one was swapped (``nn.RNNBase``
    checks its weights against weak references to them). Other inputs are new objects on
    most calls, so pinning them would recompile every call."""
    if not (isinstance(a, TensorValue) and isinstance(b, TensorValue)) or a.node is b.node:
        return None
    given = {id(g.node): g for g in tr.out.inputs}
    found = given.get(id(a.node)), given.get(id(b.node))
    reals = [g.real if g is not None else None for g in found]
    if not all(isinstance(r, nn.Parameter) for r in reals):
        return None
    for g in found:
        assert g is not None
        tr.out.guard(g.source, GuardKind.ID_MATCH, id(g.real))
    return reals[0] is reals[1]


def _guard_identity(tr: Tracer, *values: Value) -> None:
    for v in values:
        if isinstance(v, ObjectValue) and v.source is not None:
            tr.out.guard(v.source, GuardKind.ID_MATCH, id(v.obj))


# ``item in container``, answered by the container's kind --------------------------------------
@dispatch.CONTAINS.register(Value)
def _no_contains(tr: Tracer, item: Value, container: Value) -> bool:
    raise unsupported("unsupported_operator", f"in {container}")


@dispatch.CONTAINS.register(ConstantValue)
def _constant_contains(tr: Tracer, item: Value, container: ConstantValue) -> bool:
    if isinstance(item, ConstantValue):
        try:
            return item.value in container.value
        except TypeError as e:
            raise raised(e) from e
    refuse_by_type(container, _MEMBERSHIP, operator.contains, None)
    keys = _set_keys(container)
    if keys is None:
        raise unsupported("unsupported_operator", f"in {container}")
    return _pair_key(item) in keys


@dispatch.CONTAINS.register(DictValue, SetValue)
def _hashed_contains(tr: Tracer, item: Value, container: DictValue | SetValue) -> bool:
    own = _own_contains(tr, item, container)
    return dict_key(item) in container.items if own is None else own


@dispatch.CONTAINS.register(ListValue, TupleValue)
def _sequence_contains(tr: Tracer, item: Value, container: ListValue | TupleValue) -> bool:
    own = _own_contains(tr, item, container)
    return any(_equal(tr, item, x) for x in container.items) if own is None else own


@dispatch.CONTAINS.register(DictViewValue)
def _view_contains(tr: Tracer, item: Value, container: DictViewValue) -> bool:
    keys = _set_keys(container)  # a keys or items view; a values view compares each value
    if keys is not None:
        return _pair_key(item) in keys
    return any(_equal(tr, item, x) for x in container.items)


def _own_contains(tr: Tracer, item: Value, container: Value) -> bool | None:
    """The answer of a Python ``__contains__`` a container subclass defines."""
    own = builtin_types.call_override(tr, container, "__contains__", [item])
    return None if own is None else dispatch.truth(tr, own)


@dispatch.CONTAINS.register(ObjectValue)
def _object_contains(tr: Tracer, item: Value, container: ObjectValue) -> bool:
    snapshot = builtin_types.snapshot(tr, container)  # a dict, list or tuple subclass
    if snapshot is not None:
        return dispatch.contains(tr, item, snapshot)
    obj = container.obj
    if (
        isinstance(item, ConstantValue)
        and isinstance(obj, (frozenset, set, dict))
        and container.source is None
    ):
        return item.value in obj
    if type(obj) is frozenset and isinstance(item, (ConstantValue, ObjectValue)):
        # immutable: the same object always answers the same (``type(v) in _ATOMIC_TYPES`` in
        # 3.12's dataclasses.asdict)
        if container.source is not None:
            tr.out.guard(container.source, GuardKind.ID_MATCH, id(obj))
        key = item.value if isinstance(item, ConstantValue) else item.obj
        try:
            return key in obj
        except TypeError as e:  # unhashable
            raise unsupported("user_exception", str(e)) from e
    return _user_contains(tr, item, container)


@dispatch.CONTAINS.register(NewObjectValue)
def _user_contains(tr: Tracer, item: Value, container: Value) -> bool:
    method = _user_method(container, "__contains__")
    if method is None:
        raise unsupported("unsupported_operator", f"in {container}")
    return dispatch.truth(tr, dispatch.call(tr, method, [container, item], {}))


# ``bool(v)`` by kind; tensors and ndarrays refuse (torch_calls and numpy_calls register that)
@dispatch.TRUTH.register(Value)
def _truth(tr: Tracer, v: Value) -> bool:
    """Functions, methods, iterators, cells: true."""
    return True


@dispatch.TRUTH.register(ConstantValue)
def _constant_truth(tr: Tracer, v: ConstantValue) -> bool:
    return bool(v.value)


@dispatch.TRUTH.register(ListValue, TupleValue, DictValue, SetValue, DictViewValue)
def _container_truth(
    tr: Tracer, v: ListValue | TupleValue | DictValue | SetValue | DictViewValue
) -> bool:
    # the answer of a Python ``__bool__`` or ``__len__`` a container subclass defines first
    for name in ("__bool__", "__len__"):
        own = builtin_types.call_override(tr, v, name, [])
        if own is not None:
            return dispatch.truth(tr, own) if name == "__bool__" else bool(own.as_constant())
    return bool(v.items)


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
def _no_unary_op(tr: Tracer, name: str, v: Value) -> Value:
    raise unsupported("unsupported_operator", f"{name} {v}")


@dispatch.UNARY_OP.register(NewObjectValue, ObjectValue)
def _user_unary_op(tr: Tracer, name: str, v: NewObjectValue | ObjectValue) -> Value:
    method = _user_method(v, f"__{name}__")
    if method is None:
        raise unsupported("unsupported_operator", f"{name} {v}")
    return dispatch.call(tr, method, [v], {})


@dispatch.UNARY_OP.register(ConstantValue)
def _constant_unary_op(tr: Tracer, name: str, v: ConstantValue) -> Value:
    try:
        return ConstantValue(getattr(operator, name)(v.value))
    except Exception as e:
        raise raised(e) from e
