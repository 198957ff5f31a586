"""Ops on ``__torch_function__`` tensor subclasses: the override traced as Python.

Eager hands every torch function, Tensor method, operator and property on a subclass tensor to
the class's ``__torch_function__`` (``tensor_subclasses.traces_as_subclass``). Capture does the
same on the traced values: a tensor value's ``real_type`` is the class eager's object has, and
an op over values of such classes calls the override (the most derived class first, as torch
orders them) with what torch would hand it (learnt by the modes' probe), inlined as Python.
``super().__torch_function__`` is ``tensor_subclasses.tensor_torch_function``: the op with
subclass dispatch off (a ``DisableTorchFunctionSubclass`` block on the traced mode stack), its
results converted with ``as_subclass``, which the graph records as an alias of plain data. The
graph holds plain ops only; the emitted code rewraps the results eager returns as subclasses.

Torch-function modes come first, as in torch: a mode's own calls reach the subclass next.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

from kiln.capture import dispatch, function_modes
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.tensor_subclasses import traces_as_subclass
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import function_value, wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["dispatch_to_subclass", "property_through_subclass"]


def _overloaded(values: list[Value]) -> list[type]:
    """The subclasses torch hands the call to, in its order: left to right, each class before
    its bases."""
    order: list[type] = []

    def visit(v: Value) -> None:
        if isinstance(v, TensorValue):
            cls = v.real_type
            if cls not in order and traces_as_subclass(cls):
                at = next((i for i, t in enumerate(order) if issubclass(cls, t)), len(order))
                order.insert(at, cls)
        elif isinstance(v, (ListValue, TupleValue)):
            for x in v.items:
                visit(x)
        elif isinstance(v, DictValue):
            for _, x in v.items.values():
                visit(x)

    for v in values:
        visit(v)
    return order


def _subclasses(tr: Tracer, values: list[Value]) -> list[type]:
    if function_modes.stack_of(tr.out).disabled:  # inside either Disable... block
        return []
    return _overloaded(values)


def dispatch_to_subclass(
    tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]
) -> Value | None:
    """``fn(*args, **kwargs)`` through its subclass arguments' ``__torch_function__``; None
    when no argument is such a subclass or torch would not hand the call to one."""
    order = _subclasses(tr, [*args, *kwargs.values()])
    if not order:
        return None
    probed = function_modes.probe(tr, fn, args, kwargs)
    if probed is None:
        return None
    func, _, s_args, s_kwargs = probed
    if isinstance(fn, types.FunctionType) and func is not fn:
        # a torch Python function that does not dispatch itself: its ops dispatch one by one
        return dispatch.call(tr, function_value(fn, None), args, kwargs)
    return _call_override(tr, ObjectValue(func), order, s_args, s_kwargs)


def property_through_subclass(tr: Tracer, tensor: TensorValue, name: str) -> Value | None:
    """``tensor.name`` for a property, through the subclass's ``__torch_function__`` (which
    gets ``Tensor.name.__get__`` and ``(tensor,)``, as in eager); None for other tensors."""
    order = _subclasses(tr, [tensor])
    if not order:
        return None
    probed = function_modes.probe(tr, lambda t: getattr(t, name), [tensor], {})
    if probed is None:
        return None
    func, _, s_args, s_kwargs = probed
    getter = function_modes.PropertyGetter(func, name)
    return _call_override(tr, getter, order, s_args, s_kwargs)


def _call_override(
    tr: Tracer,
    func: ObjectValue,
    order: list[type],
    s_args: list[Value],
    s_kwargs: dict[str, Value],
) -> Value:
    """Each class's ``__torch_function__`` in turn, until one does not return NotImplemented."""
    types_ = TupleValue([ObjectValue(t) for t in order])
    for cls in order:
        handler = dispatch.get_attr(tr, wrap(tr.out, cls, None), "__torch_function__")
        result = dispatch.call(
            tr,
            handler,
            [
                func,
                types_,
                TupleValue(s_args),
                DictValue({k: (ConstantValue(k), v) for k, v in s_kwargs.items()}),
            ],
            {},
        )
        if not (isinstance(result, ConstantValue) and result.value is NotImplemented):
            return result
    names = ", ".join(t.__name__ for t in order)
    raise unsupported("user_exception", f"every __torch_function__ of {names} gave NotImplemented")
