"""Turning real objects read from the frame into tracked values, recording guards.

Everything capture learns from the frame passes through :func:`wrap`: tensors
become graph inputs (TENSOR_MATCH), constants are specialized (EQUALS /
IS_NONE), containers are guarded on type and length or keys and wrapped item
by item, modules on identity, functions and classes on identity, any other
object on its type. Values without a source are wrapped without guards.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import types
from typing import Any

import torch

from kiln.capture import torch_calls
from kiln.capture.break_reasons import unsupported
from kiln.capture.graph import OutputGraph
from kiln.capture.guard_data import GuardKind
from kiln.capture.source import Source
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import CellValue, DictValue, ListValue, TupleValue
from kiln.capture.values.functions import UserFunctionValue
from kiln.capture.values.objects import ObjectValue

__all__ = ["wrap", "is_namedtuple"]

_ID_MATCHED = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
)


def is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def wrap(out: OutputGraph, obj: Any, source: Source | None) -> Value:
    """The tracked value of the real object ``obj`` found at ``source``.

    Mutable objects are wrapped once per capture, so every path to one object
    sees the same value (and the same pending mutations).
    """
    if isinstance(obj, torch.Tensor) or is_constant(obj):
        return _wrap(out, obj, source)
    known = out.side_effects.known(obj)
    if known is not None:
        return known
    value = _wrap(out, obj, source)
    if value.source is not None:
        out.side_effects.remember(obj, value)
    return value


def _wrap(out: OutputGraph, obj: Any, source: Source | None) -> Value:
    if isinstance(obj, torch.Tensor):
        if source is None:
            # a tensor the trace did not compute and cannot reload: never bake it in
            raise unsupported("unsupported_value", "a tensor with no place in the frame")
        if type(obj) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
            obj, torch.nn.Parameter
        ):
            # a subclass may override ops (__torch_function__) in ways fakes do not see
            raise unsupported("unsupported_value", f"a tensor of type {type(obj).__name__}")
        return out.add_input(source, obj)
    if is_constant(obj):
        if source is not None:
            if obj is None:
                out.guard(source, GuardKind.IS_NONE)
            else:
                out.guard(source, GuardKind.EQUALS, obj)
        return ConstantValue(obj, source)
    if type(obj) in (list, tuple) or (isinstance(obj, tuple) and is_namedtuple(type(obj))):
        return _wrap_sequence(out, obj, source)
    if isinstance(obj, dict) and _plain_dict_type(type(obj)):
        return _wrap_dict(out, obj, source)
    if isinstance(obj, torch.nn.Module):
        if source is not None:
            out.guard(source, GuardKind.MODULE_MATCH, id(obj))
            # lets kiln.guards check what is read under it by the module stamp, in O(1)
            # (nested trees join the enclosing one's group)
            out.guard(source, GuardKind.MODULE_TREE, obj)
        return ObjectValue(obj, source)
    if isinstance(obj, types.FunctionType):
        if source is not None:
            out.guard(source, GuardKind.ID_MATCH, id(obj))
        if torch_calls.is_special(obj) or torch_calls.is_torch_callable(obj):
            return ObjectValue(obj, source)
        if _is_compile_disable_wrapper(obj):
            inner_src = source.attr("__wrapped__") if source is not None else None
            return _wrap(out, obj.__wrapped__, inner_src)  # type: ignore[attr-defined]
        return function_value(obj, source)
    if source is not None:
        if isinstance(obj, _ID_MATCHED) or _is_singleton(obj):
            out.guard(source, GuardKind.ID_MATCH, id(obj))
        else:
            out.guard(source, GuardKind.TYPE_MATCH, type(obj))
    return ObjectValue(obj, source)


def function_value(fn: types.FunctionType, source: Source | None) -> UserFunctionValue:
    """A real Python function; its closure cells are read through ``source`` when known."""
    closure: tuple[CellValue, ...] = ()
    if fn.__closure__:
        base = source.attr("__closure__") if source is not None else None
        closure = tuple(
            CellValue(real=cell, source=base.item(i).attr("cell_contents") if base else None)
            for i, cell in enumerate(fn.__closure__)
        )
    return UserFunctionValue(
        fn.__code__,
        fn.__globals__,
        name=fn.__name__,
        closure=closure,
        real=fn,
        source=source,
        globals_source=source.attr("__globals__") if source is not None else None,
    )


def _is_compile_disable_wrapper(fn: types.FunctionType) -> bool:
    """torch's lazy "not under a compiler" wrapper: capture traces the wrapped function."""
    wrapped = getattr(fn, "__wrapped__", None)
    return isinstance(wrapped, types.FunctionType) and fn.__code__.co_filename.endswith(
        ("torch/_compile.py", "torch\\_compile.py")
    )


def _is_singleton(obj: Any) -> bool:
    return obj is NotImplemented or isinstance(obj, (torch.finfo, torch.iinfo, enum.Enum))


def _plain_dict_type(cls: type) -> bool:
    if cls in (dict, collections.OrderedDict):
        return True
    return dataclasses.is_dataclass(cls) and issubclass(cls, collections.OrderedDict)


def _wrap_sequence(out: OutputGraph, obj: Any, source: Source | None) -> Value:
    if source is not None:
        out.guard(source, GuardKind.TYPE_MATCH, type(obj))
        out.guard(source, GuardKind.SEQUENCE_LENGTH, len(obj))
    items = [wrap(out, x, source.item(i) if source else None) for i, x in enumerate(obj)]
    if isinstance(obj, list):
        lst = ListValue(items, source)
        lst.detached = source is None
        return lst
    return TupleValue(items, type(obj), source)


def _wrap_dict(out: OutputGraph, obj: dict[Any, Any], source: Source | None) -> Value:
    if source is not None:
        out.guard(source, GuardKind.TYPE_MATCH, type(obj))
        out.guard(source, GuardKind.DICT_KEYS, tuple(obj.keys()))
    items: dict[Any, tuple[Value, Value]] = {}
    for k, v in obj.items():
        if not is_constant(k):
            key: Value = ObjectValue(k)
        else:
            key = ConstantValue(k)
        items[k] = (key, wrap(out, v, source.item(k) if source else None))
    d = DictValue(items, type(obj), source)
    d.detached = source is None
    return d
