"""Item access on tracked values: ``x[i]``, ``x[i] = v`` and ``del x[i]``, by kind.

Sequences and dicts made or mirrored by the trace are read and updated in place (a Python
``__getitem__`` of a container subclass runs first); items of ``nn`` containers are wrapped with
sources through the container's ``_modules`` dict; other objects' items are read for real and
guarded. Tensors' and ndarrays' items are registered by ``torch_calls`` and ``numpy_calls``.
"""

from __future__ import annotations

import inspect
import operator
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import builtin_types, dispatch
from kiln.capture.attributes import class_attr
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.literals import is_literal, literal, refuse_by_type
from kiln.capture.model_output import is_model_output
from kiln.capture.source import Source
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, TupleValue, dict_key
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.wrap import function_value, wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["container_item_source"]

# subscripting a typing construct or a builtin class (``List[Tensor]``, ``list[Tensor]``) makes
# an annotation: pure and cached, so done for real, not inlined
_TYPING = frozenset({"typing", "typing_extensions"})
_GENERIC_CLASSES = frozenset({"builtins", "collections", "collections.abc"})


def _is_annotation(obj: Any) -> bool:
    if isinstance(obj, type):
        return obj.__module__ in _GENERIC_CLASSES
    return type(obj).__module__ in _TYPING


# ``v[index]`` ------------------------------------------------------------------
@dispatch.GET_ITEM.register(Value)
def _get_item(tr: Tracer, v: Value, index: Value) -> Value:
    own = builtin_types.call_override(tr, v, "__getitem__", [index])
    if own is not None:
        return own
    raise unsupported("unsupported_operator", f"{v}[{index}]")


@dispatch.GET_ITEM.register(ListValue, TupleValue)
def _sequence_item(tr: Tracer, v: ListValue | TupleValue, index: Value) -> Value:
    own = builtin_types.call_override(tr, v, "__getitem__", [index])
    if own is not None:
        return own
    key = index.as_constant() if isinstance(index, ConstantValue) else None
    if isinstance(key, slice):
        items = v.items[key]
        return ListValue(items) if isinstance(v, ListValue) else TupleValue(items)
    if isinstance(key, int):
        try:
            return v.items[key]
        except IndexError as e:
            raise raised(e) from e
    raise unsupported("unsupported_operator", f"indexing a sequence with {index}")


@dispatch.GET_ITEM.register(DictValue)
def _dict_item(tr: Tracer, v: DictValue, index: Value) -> Value:
    own = builtin_types.call_override(tr, v, "__getitem__", [index])
    if own is not None:
        return own
    positional = isinstance(index, ConstantValue) and isinstance(index.value, (int, slice))
    if positional and is_model_output(v.cls) and not isinstance(index.as_constant(), bool):
        own_tuple = builtin_types.python_method(tr, v, "to_tuple")  # ModelOutput's reads it
        if own_tuple is not None:
            return dispatch.get_item(tr, dispatch.call(tr, own_tuple, [], {}), index)
        values = [x for _, x in v.items.values()]
        found = values[index.as_constant()]
        return TupleValue(found) if isinstance(found, list) else found
    found_v = v.get(index)
    if found_v is None:
        raise raised(KeyError(dict_key(index)))
    return found_v


@dispatch.GET_ITEM.register(ConstantValue)
def _constant_item(tr: Tracer, v: ConstantValue, index: Value) -> Value:
    refuse_by_type(v, ("__getitem__",), operator.getitem, _plain(index))
    if not is_literal(index):
        raise unsupported("unsupported_operator", f"{v}[{index}]")
    try:
        result = v.value[literal(index)]
    except Exception as e:
        raise raised(e) from e
    return ConstantValue(result)


@dispatch.GET_ITEM.register(NewObjectValue)
def _new_object_item(tr: Tracer, v: NewObjectValue, index: Value) -> Value:
    method = class_attr(tr, v, v.cls, "__getitem__", None)
    return dispatch.call(tr, method, [index], {})


@dispatch.GET_ITEM.register(ObjectValue)
def _object_item(tr: Tracer, v: ObjectValue, index: Value) -> Value:
    obj = v.obj
    if _is_annotation(obj):  # its parameters are classes, not constants
        try:
            return wrap(tr.out, obj[literal(index)], None)
        except TypeError as e:
            raise raised(e) from e
    key = index.as_constant()
    if isinstance(
        obj,
        (
            torch.nn.ModuleList,
            torch.nn.Sequential,
            torch.nn.ModuleDict,
            torch.nn.ParameterList,
            torch.nn.ParameterDict,
        ),
    ):
        if isinstance(key, slice) and isinstance(
            obj, (torch.nn.ModuleList, torch.nn.ParameterList)
        ):
            # a slice is a new container: its items keep their places in the original
            picked = range(len(obj))[key]
            src = v.source
            return ListValue(
                [wrap(tr.out, obj[i], container_item_source(obj, src, i)) for i in picked]
            )
        if isinstance(key, slice):
            return ObjectValue(obj[key])  # type: ignore[index]
        return wrap(tr.out, obj[key], container_item_source(obj, v.source, key))
    getitem = inspect.getattr_static(type(obj), "__getitem__", None)
    if isinstance(getitem, types.FunctionType):
        return dispatch.call(tr, function_value(getitem, None), [v, index], {})
    if isinstance(obj, (dict, list, tuple, str)) or hasattr(obj, "__getitem__"):
        src = v.source.item(key) if v.source is not None and is_constant(key) else None
        try:
            item = obj[key]
        except Exception as e:
            raise raised(e) from e
        return wrap(tr.out, item, src)
    raise unsupported("unsupported_operator", f"{type(obj).__name__}[...]")


def container_item_source(obj: Any, src: Source | None, key: Any) -> Source | None:
    """How emitted code and guards reload ``obj[key]`` of an ``nn`` container.

    Submodules are reached through the container's ``_modules`` dict: a dict lookup, where
    ``Sequential.__getitem__`` walks the modules and runs on every call of the output code
    and of the guards (hundreds of times for a deep model).
    """
    if src is None:
        return None
    if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential)):
        return src.attr("_modules").item(list(obj._modules)[key])
    if isinstance(obj, torch.nn.ModuleDict):
        return src.attr("_modules").item(key)
    return src.item(key)


# ``v[index] = value`` and ``del v[index]`` -----------------------------------------
@dispatch.SET_ITEM.register(Value)
def _set_item(tr: Tracer, v: Value, index: Value, value: Value) -> None:
    if builtin_types.call_override(tr, v, "__setitem__", [index, value]) is None:
        raise unsupported("side_effect", f"setting an item of {v}")


@dispatch.SET_ITEM.register(ListValue)
def _set_list_item(tr: Tracer, v: ListValue, index: Value, value: Value) -> None:
    if builtin_types.call_override(tr, v, "__setitem__", [index, value]) is not None:
        return
    v.check_mutable()
    key = index.as_constant()
    if isinstance(key, slice):
        if not isinstance(value, (ListValue, TupleValue)):
            raise unsupported("unsupported_operator", "slice assignment from a non-sequence")
        v.items[key] = value.items
    else:
        v.items[key] = value


@dispatch.SET_ITEM.register(DictValue)
def _set_dict_item(tr: Tracer, v: DictValue, index: Value, value: Value) -> None:
    if builtin_types.call_override(tr, v, "__setitem__", [index, value]) is None:
        v.set(index, value)


@dispatch.SET_ITEM.register(ConstantValue)
def _set_constant_item(tr: Tracer, v: ConstantValue, index: Value, value: Value) -> None:
    refuse_by_type(v, ("__setitem__",), operator.setitem, _plain(index), None)
    raise unsupported("side_effect", f"setting an item of {v}")


def _plain(index: Value) -> Any:
    """The index for a refusal's message (its wording may depend on the index's type)."""
    return literal(index) if is_literal(index) else None


@dispatch.DELETE_ITEM.register(ConstantValue)
def _delete_constant_item(tr: Tracer, v: ConstantValue, index: Value) -> None:
    refuse_by_type(v, ("__delitem__",), operator.delitem, _plain(index))
    raise unsupported("side_effect", f"deleting an item of {v}")


@dispatch.DELETE_ITEM.register(Value)
def _delete_item(tr: Tracer, v: Value, index: Value) -> None:
    if builtin_types.call_override(tr, v, "__delitem__", [index]) is None:
        raise unsupported("side_effect", f"deleting an item of {v}")


@dispatch.DELETE_ITEM.register(ListValue)
def _delete_list_item(tr: Tracer, v: ListValue, index: Value) -> None:
    if builtin_types.call_override(tr, v, "__delitem__", [index]) is None:
        v.check_mutable()
        del v.items[index.as_constant()]


@dispatch.DELETE_ITEM.register(DictValue)
def _delete_dict_item(tr: Tracer, v: DictValue, index: Value) -> None:
    if builtin_types.call_override(tr, v, "__delitem__", [index]) is None:
        v.check_mutable()
        v.items.pop(dict_key(index), None)
