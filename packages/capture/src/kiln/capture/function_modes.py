"""Torch-function modes (``torch.overrides.TorchFunctionMode``) inside a captured frame.

``with Mode():`` is traced as the Python it is: ``TorchFunctionMode.__enter__`` reaches
``torch._C._push_on_torch_function_stack(mode)`` and ``__exit__`` its pop. Those C functions,
and the ones reading the stack, act on a stack kept per trace (:class:`ModeStack`), never on
torch's: the real stack would run the mode on the tracer's fake tensors. While the traced stack
holds a mode, every torch function, Tensor method and tensor operator the trace calls goes
through the top mode's ``__torch_function__``, inlined as Python with that mode popped (its own
calls reach the next mode down, then the graph), as torch does.

What torch hands ``__torch_function__`` (the public callable, ``types``, ``args`` and
``kwargs``: ``x + y`` arrives as ``Tensor.add(x, y)``, ``x[i]`` as ``Tensor.__getitem__``,
``F.softmax(x, 1)`` with its keyword arguments) is learnt by calling the op on the fake
arguments under a probe mode that records the call and stops it, so the trace sees exactly what
eager's mode would. A torch Python function that calls ops without dispatching itself is traced
as Python, so the mode sees each op it calls.

A graph break with a mode open in the captured frame is not resumed (the instruction would run
in Python without the mode): the frame runs eagerly under it. :func:`open_at` says so.
"""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from kiln.capture import dispatch
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import function_value

if TYPE_CHECKING:
    from kiln.capture.graph import OutputGraph
    from kiln.capture.tracer import Tracer

__all__ = [
    "ModeStack",
    "active",
    "dispatch_to_mode",
    "intercept",
    "make_block",
    "open_at",
    "property_through_mode",
    "stack_of",
]


class ModeStack:
    """The torch-function mode stack as the traced program sees it, bottom first.

    ``history`` holds the stack after each change with the root frame's instruction index
    that made it, so the stack before any root instruction is known after a rollback.
    """

    def __init__(self) -> None:
        self.modes: list[Value] = []
        # open ``DisableTorchFunction`` (True) / ``DisableTorchFunctionSubclass`` (False) blocks
        self.disabled: list[bool] = []
        self.history: list[tuple[int, bool]] = []

    def active(self) -> bool:
        """Whether torch hands calls to the top mode: one is open and none is disabled."""
        return bool(self.modes) and not any(self.disabled)

    def may_change(self, tr: Tracer) -> None:
        """Refuse a change made by a generator's code."""
        t: Tracer | None = tr
        while t is not None:
            if t.yielded is not None:
                # a generator runs to its end at its call, not between its consumer's steps
                raise unsupported(
                    "unsupported_context", "torch-function mode state changed in a generator"
                )
            t = t.parent

    def changed(self, tr: Tracer) -> None:
        root = tr.out.active[0] if tr.out.active else tr
        self.history.append((root.ip - 1, bool(self.modes or self.disabled)))


_STACKS: weakref.WeakKeyDictionary[OutputGraph, ModeStack] = weakref.WeakKeyDictionary()


def stack_of(out: OutputGraph) -> ModeStack:
    stack = _STACKS.get(out)
    if stack is None:
        stack = _STACKS[out] = ModeStack()
    return stack


def active(tr: Tracer) -> bool:
    """Whether torch would hand the trace's torch calls to a mode now."""
    stack = _STACKS.get(tr.out)
    return stack is not None and stack.active()


def open_at(out: OutputGraph, index: int) -> bool:
    """Whether a mode entered in the frame is open before the root instruction ``index``."""
    stack = _STACKS.get(out)
    if stack is None:
        return False
    current = False
    for at, is_open in stack.history:
        if at >= index:
            break
        current = is_open
    return current


def _push(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    stack = stack_of(tr.out)
    stack.may_change(tr)
    stack.modes.append(args[0])
    stack.changed(tr)
    return ConstantValue(None)


def _pop(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    stack = stack_of(tr.out)
    if not stack.modes:
        raise unsupported("user_exception", "pop from an empty torch-function mode stack")
    stack.may_change(tr)
    mode = stack.modes.pop()
    stack.changed(tr)
    return mode


def _length(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(len(stack_of(tr.out).modes))


def _at(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    modes = stack_of(tr.out).modes
    i = args[0].as_constant()
    if not isinstance(i, int) or not -len(modes) <= i < len(modes):
        raise unsupported("user_exception", "torch-function mode stack index out of range")
    return modes[i]


def _enabled(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    return ConstantValue(stack_of(tr.out).active())


_C: Any = torch._C
_STACK_FUNCTIONS = {
    name: handler
    for name, handler in (
        ("_push_on_torch_function_stack", _push),
        ("_pop_torch_function_stack", _pop),
        ("_len_torch_function_stack", _length),
        ("_get_function_stack_at", _at),
        ("_is_torch_function_mode_enabled", _enabled),
    )
    if hasattr(_C, name)
}
_HANDLERS = {getattr(_C, name): handler for name, handler in _STACK_FUNCTIONS.items()}


def intercept(tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """A call of one of torch's mode-stack functions, answered from the traced stack."""
    try:
        handler = _HANDLERS.get(fn)
    except TypeError:  # an unhashable callable
        return None
    return handler(tr, args, kwargs) if handler is not None else None


class _Probed(Exception):
    """Raised by :class:`_Probe` to stop the op once torch has handed it to the mode."""

    def __init__(self, func: Any, types_: tuple[type, ...], args: Any, kwargs: Any) -> None:
        super().__init__()
        self.call = (func, types_, args, kwargs)


class _Probe(torch.overrides.TorchFunctionMode):
    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Any = (),
        kwargs: Any = None,
    ) -> Any:
        raise _Probed(func, tuple(types), args, kwargs or {})


def _fakes(v: Value, found: dict[int, Value]) -> None:
    if isinstance(v, TensorValue):
        found[id(v.fake)] = v
    elif isinstance(v, (ListValue, TupleValue)):
        for x in v.items:
            _fakes(x, found)
    elif isinstance(v, DictValue):
        for _, x in v.items.values():
            _fakes(x, found)


def _real(v: Value) -> Any:
    """The object a probe call is given for ``v``: its fake tensor or its constant."""
    if isinstance(v, TensorValue):
        return v.fake
    if isinstance(v, ListValue):
        return [_real(x) for x in v.items]
    if isinstance(v, TupleValue):
        return tuple(_real(x) for x in v.items)
    if isinstance(v, DictValue) and v.cls is dict:
        return {k: _real(x) for k, (_, x) in v.items.items()}
    if isinstance(v, ConstantValue):
        return v.value
    if isinstance(v, ObjectValue):
        return v.obj
    raise unsupported("unsupported_value", f"{v} as an argument of a torch op under a mode")


def _value(obj: Any, found: dict[int, Value]) -> Value:
    """The traced value for an object the probe saw: an argument's value, or a constant."""
    if id(obj) in found:
        return found[id(obj)]
    if isinstance(obj, torch.Tensor):
        raise unsupported("unsupported_value", "a tensor made while torch dispatched to a mode")
    if type(obj) is list:
        return ListValue([_value(x, found) for x in obj])
    if type(obj) is tuple and not is_constant(obj):
        return TupleValue([_value(x, found) for x in obj])
    if type(obj) is dict:
        return DictValue({k: (ConstantValue(k), _value(x, found)) for k, x in obj.items()})
    return ConstantValue(obj) if is_constant(obj) else ObjectValue(obj)


def probe(
    tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]
) -> tuple[Any, tuple[type, ...], list[Value], dict[str, Value]] | None:
    """What torch hands a mode for ``fn(*args, **kwargs)``; None when it hands it nothing."""
    found: dict[int, Value] = {}
    for a in [*args, *kwargs.values()]:
        _fakes(a, found)
    real_args = [_real(a) for a in args]
    real_kwargs = {k: _real(v) for k, v in kwargs.items()}
    try:
        with tr.out.fake_mode, _Probe():
            fn(*real_args, **real_kwargs)
    except _Probed as p:
        func, types_, p_args, p_kwargs = p.call
        leaves = pytree.tree_leaves((p_args, p_kwargs))
        if any(isinstance(x, torch.Tensor) and id(x) not in found for x in leaves):
            raise unsupported(
                "unsupported_call", f"{fn} hands a mode a tensor it made itself"
            ) from None
        return (
            func,
            types_,
            [_value(a, found) for a in p_args],
            {k: _value(v, found) for k, v in p_kwargs.items()},
        )
    except Exception:  # the op fails on these arguments before any mode sees it
        return None
    return None


def dispatch_to_mode(
    tr: Tracer, fn: Any, args: list[Value], kwargs: dict[str, Value]
) -> Value | None:
    """``fn(*args, **kwargs)`` through the traced stack's top mode; None when no mode is open
    or torch would not hand this call to one (the caller then evaluates it as usual)."""
    stack = _STACKS.get(tr.out)
    if stack is None or not stack.active():
        return None
    probed = probe(tr, fn, args, kwargs)
    if probed is None:
        return None
    func, types_, m_args, m_kwargs = probed
    if isinstance(fn, types.FunctionType) and func is not fn:
        # a torch Python function that does not dispatch itself: its ops meet the mode one by one
        return dispatch.call(tr, function_value(fn, None), args, kwargs)
    return _call_mode(tr, stack, ObjectValue(func), types_, m_args, m_kwargs)


def _call_mode(
    tr: Tracer,
    stack: ModeStack,
    func: ObjectValue,
    types_: tuple[type, ...],
    m_args: list[Value],
    m_kwargs: dict[str, Value],
) -> Value:
    """The top mode's ``__torch_function__(func, types_, m_args, m_kwargs)``, with it popped."""
    mode = stack.modes.pop()  # put back before the call returns: no root state changes
    try:
        handler = dispatch.get_attr(tr, mode, "__torch_function__")
        result = dispatch.call(
            tr,
            handler,
            [
                func,
                TupleValue([ObjectValue(t) for t in types_]),
                TupleValue(m_args),
                DictValue({k: (ConstantValue(k), v) for k, v in m_kwargs.items()}),
            ],
            {},
        )
    finally:
        stack.modes.append(mode)
    if isinstance(result, ConstantValue) and result.value is NotImplemented:
        raise unsupported(
            "unsupported_call", f"a torch-function mode returned NotImplemented for {func.obj}"
        )
    return result


class PropertyGetter(ObjectValue):
    """``Tensor.<property>.__get__`` as a mode receives it: calling it reads the property."""

    def __init__(self, getter: Any, name: str) -> None:
        super().__init__(getter)
        self.name = name


@dispatch.CALL.register(PropertyGetter)
def _call_getter(
    tr: Tracer, fn: PropertyGetter, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    if len(args) != 1 or kwargs:
        raise unsupported("unsupported_call", f"Tensor.{fn.name}.__get__ with these arguments")
    return dispatch.get_attr(tr, args[0], fn.name)


def property_through_mode(tr: Tracer, tensor: TensorValue, name: str) -> Value | None:
    """``tensor.name`` for a property torch hands to a mode (``x.shape``); None when no mode
    is open. The mode gets ``Tensor.name.__get__`` and ``(tensor,)``, as in eager."""
    stack = _STACKS.get(tr.out)
    if stack is None or not stack.active():
        return None
    if not hasattr(getattr(torch._C.TensorBase, name, None), "__get__"):
        return None
    probed = probe(tr, lambda t: getattr(t, name), [tensor], {})
    if probed is None:
        return None
    func, types_, m_args, m_kwargs = probed
    return _call_mode(tr, stack, PropertyGetter(func, name), types_, m_args, m_kwargs)


class _DisabledBlock(Value):
    """``torch._C.DisableTorchFunction()`` (modes too) or ``DisableTorchFunctionSubclass()``.

    Tensors in a trace are plain, so only the modes' part has an effect: none runs inside a
    ``DisableTorchFunction`` block, nested blocks of either kind included, as in torch.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def python_type(self) -> type:
        return self.cls


class _BlockMethod(Value):
    def __init__(self, block: _DisabledBlock, name: str) -> None:
        self.block = block
        self.name = name

    def python_type(self) -> type:
        return types.BuiltinMethodType


_DISABLING: dict[Any, bool] = {
    _C.DisableTorchFunction: True,
    _C.DisableTorchFunctionSubclass: False,
}


def make_block(obj: Any, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """The value of calling ``obj`` when it is one of torch's torch-function switches."""
    if not isinstance(obj, type) or obj not in _DISABLING:
        return None
    if args or kwargs:
        raise unsupported("unsupported_call", f"{obj.__name__} with arguments")
    return _DisabledBlock(obj)


@dispatch.GET_ATTR.register(_DisabledBlock)
def _block_attr(tr: Tracer, v: _DisabledBlock, name: str) -> Value:
    if name not in ("__enter__", "__exit__"):
        raise unsupported("unsupported_attribute", f"{v.cls.__name__}.{name}")
    return _BlockMethod(v, name)


@dispatch.CALL.register(_BlockMethod)
def _call_block(tr: Tracer, fn: _BlockMethod, args: list[Value], kwargs: dict[str, Value]) -> Value:
    stack = stack_of(tr.out)
    stack.may_change(tr)
    if fn.name == "__enter__":
        stack.disabled.append(_DISABLING[fn.block.cls])
    elif stack.disabled:
        stack.disabled.pop()
    stack.changed(tr)
    return ConstantValue(None)
