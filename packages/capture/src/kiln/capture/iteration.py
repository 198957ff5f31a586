"""Iteration over tracked values: ``iter``, unpacking and ``len``.

``for`` loops unroll over the iterator :func:`iterate` gives (GET_ITER / FOR_ITER), and
``a, b = v``, ``f(*v)``, ``list(v)`` and the builtins that consume an iterable take all its items
at once. Module containers are guarded on their length or keys, so an unrolled loop is valid
only while they stay the same. The handlers are registered in :mod:`~kiln.capture.dispatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kiln.capture import builtin_types, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.items import container_item_source
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import DictValue, DictViewValue, ListValue, SetValue, TupleValue
from kiln.capture.values.iterators import ItemsIterator, IteratorValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["guard_module_container", "next_item", "unpack_iterable"]


# ``iter(v)`` by kind: an iterator the loop can unroll. A container subclass's own Python
# ``__iter__`` runs first; tensors' is registered by torch_calls.
@dispatch.ITERATE.register(Value)
def _iterate(tr: Tracer, v: Value) -> IteratorValue:
    raise unsupported("unsupported_operator", f"iter({v})")


@dispatch.ITERATE.register(IteratorValue)
def _iterate_iterator(tr: Tracer, v: IteratorValue) -> IteratorValue:
    return v


@dispatch.ITERATE.register(ListValue, TupleValue, DictViewValue)
def _iterate_sequence(tr: Tracer, v: ListValue | TupleValue | DictViewValue) -> IteratorValue:
    return _own_iterator(tr, v) or ItemsIterator(list(v.items))


@dispatch.ITERATE.register(DictValue)
def _iterate_dict(tr: Tracer, v: DictValue) -> IteratorValue:
    return _own_iterator(tr, v) or ItemsIterator([k for k, _ in v.items.values()])


@dispatch.ITERATE.register(SetValue)
def _iterate_set(tr: Tracer, v: SetValue) -> IteratorValue:
    return _own_iterator(tr, v) or ItemsIterator(v.ordered())


def _own_iterator(tr: Tracer, v: Value) -> IteratorValue | None:
    """What a Python ``__iter__`` a container subclass defines returns, iterated."""
    own = builtin_types.call_override(tr, v, "__iter__", [])
    return None if own is None else dispatch.iterate(tr, own)


@dispatch.ITERATE.register(ConstantValue)
def _iterate_constant(tr: Tracer, v: ConstantValue) -> IteratorValue:
    try:
        return ItemsIterator([ConstantValue(x) for x in v.value])
    except TypeError as e:
        raise raised(e) from e


@dispatch.ITERATE.register(NewObjectValue)
def _iterate_new_object(tr: Tracer, v: NewObjectValue) -> IteratorValue:
    method = dispatch.get_attr(tr, v, "__iter__")
    return dispatch.iterate(tr, dispatch.call(tr, method, [], {}))


@dispatch.ITERATE.register(ObjectValue)
def _iterate_object(tr: Tracer, v: ObjectValue) -> IteratorValue:
    obj = v.obj
    src = v.source
    guard_module_container(tr, v)
    if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
        return ItemsIterator(
            [wrap(tr.out, m, container_item_source(obj, src, i)) for i, m in enumerate(obj)]
        )
    if isinstance(obj, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
        return ItemsIterator([ConstantValue(k) for k in obj])
    if type(obj) in (dict, list, tuple, set, frozenset, range, str):
        return dispatch.iterate(tr, wrap(tr.out, obj, src))
    items = builtin_types.snapshot(tr, v)  # a dict, list or tuple subclass
    if items is not None:
        return dispatch.iterate(tr, items)
    method = dispatch.get_attr(tr, v, "__iter__")
    return dispatch.iterate(tr, dispatch.call(tr, method, [], {}))


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


@dispatch.UNPACK.register(Value)
def unpack_iterable(tr: Tracer, v: Value) -> list[Value]:
    """All items of a finite iterable."""
    it = dispatch.iterate(tr, v)
    items: list[Value] = []
    while True:
        x = next_item(tr, it)
        if x is None:
            return items
        items.append(x)
        if len(items) > 100_000:
            raise unsupported("inline_limit", "an iterable with over 100000 items")


def next_item(tr: Tracer, it: IteratorValue) -> Value | None:
    """The next item of ``it``, None when it is exhausted (maps and filters call through ``tr``)."""
    return it.next(_caller(tr), _truth(tr))


def _caller(tr: Tracer) -> Callable[[Value, list[Value]], Value]:
    return lambda fn, args: dispatch.call(tr, fn, args, {})


def _truth(tr: Tracer) -> Callable[[Value], bool]:
    return lambda v: dispatch.truth(tr, v)


# ``len(v)`` by kind; a container subclass's own Python ``__len__`` runs first; tensors' and
# ndarrays' are registered by torch_calls and numpy_calls.
@dispatch.LENGTH.register(Value)
def _length(tr: Tracer, v: Value) -> int:
    method = dispatch.get_attr(tr, v, "__len__")
    return int(dispatch.call(tr, method, [], {}).as_constant())


@dispatch.LENGTH.register(ListValue, TupleValue, DictValue, SetValue, DictViewValue)
def _container_length(
    tr: Tracer, v: ListValue | TupleValue | DictValue | SetValue | DictViewValue
) -> int:
    own = builtin_types.call_override(tr, v, "__len__", [])
    return len(v.items) if own is None else int(own.as_constant())


@dispatch.LENGTH.register(ConstantValue)
def _constant_length(tr: Tracer, v: ConstantValue) -> int:
    try:
        return len(v.value)
    except TypeError as e:
        raise raised(e) from e


@dispatch.LENGTH.register(ObjectValue)
def _object_length(tr: Tracer, v: ObjectValue) -> int:
    if isinstance(v.obj, torch.nn.Module) or type(v.obj).__module__ == "builtins":
        guard_module_container(tr, v)
        return len(v.obj)
    return _length(tr, v)
