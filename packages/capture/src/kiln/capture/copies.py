"""``copy.copy`` and ``copy.deepcopy`` of tracked values.

A shallow copy is a new tracked container (or new object) holding the same values.
A deep copy of constants folds; of a tensor that does not require grad it is a clone; of
a plain frame object (a config) it is a private real snapshot whose state is guarded, so
the copy may be read and changed in the trace.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import dispatch, literals
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.source import Source
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, SetValue, TupleValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["deep_copy", "shallow_copy"]


def shallow_copy(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A shallow copy: a new container (or new object) holding the same values."""
    v = args[0]
    copied: ListValue | DictValue | SetValue
    if isinstance(v, ListValue):
        copied = ListValue(list(v.items), cls=v.cls)
    elif isinstance(v, DictValue):
        copied = DictValue(dict(v.items), v.cls)
    elif isinstance(v, SetValue):
        copied = SetValue(dict(v.items), cls=v.cls)
    else:
        return _shallow_copy_other(v)
    copied.attrs = dict(v.attrs)  # a subclass instance's own attributes come along
    return copied


def _shallow_copy_other(v: Value) -> Value:
    if isinstance(v, NewObjectValue):
        return NewObjectValue(v.cls, dict(v.attrs))
    if isinstance(v, (ConstantValue, TupleValue)):
        return v
    raise unsupported("unsupported_call", f"copy.copy of {v}")


def deep_copy(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    v = args[0]
    if literals.is_literal(v):
        return literals.fold(copy.deepcopy, args[:1], {})
    if isinstance(v, TensorValue) and v.real_type is torch.Tensor and not v.fake.requires_grad:
        # a new tensor with the same values (``dataclasses.asdict`` copies its leaves so);
        # one that requires grad becomes a new leaf or raises, which a graph cannot express
        return dispatch.call(tr, ObjectValue(torch.clone), [v], {})
    if isinstance(v, ObjectValue) and v.source is not None and hasattr(v.obj, "__dict__"):
        # a snapshot of a plain object (a config): its state is guarded, the copy is private
        _guard_state(tr, v.obj, v.source, depth=2)
        if tr.out.side_effects.attr_stores.get(id(v.obj)):
            raise unsupported("unsupported_call", "copy.deepcopy of an object with pending stores")
        try:
            snapshot = copy.deepcopy(v.obj)
        except Exception as e:
            raise unsupported("unsupported_call", f"copy.deepcopy failed: {e}") from e
        return ObjectValue(snapshot, private=True)
    raise unsupported("unsupported_call", f"copy.deepcopy of {v}")


def _guard_state(tr: Tracer, obj: Any, source: Source, depth: int) -> None:
    """Guard every attribute of ``obj`` a copy would carry (nested objects to ``depth``)."""
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor):
            raise unsupported("unsupported_call", "copy.deepcopy of an object holding tensors")
        if (
            depth > 0
            and not is_constant(value)
            and hasattr(value, "__dict__")
            and not callable(value)
        ):
            tr.out.guard(source.attr(name), GuardKind.TYPE_MATCH, type(value))
            _guard_state(tr, value, source.attr(name), depth - 1)
        else:
            wrap(tr.out, value, source.attr(name))
