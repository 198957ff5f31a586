"""Turning real objects read from the frame into tracked values, recording guards.

Everything capture learns from the frame passes through :func:`wrap`: tensors
become graph inputs (TENSOR_MATCH), constants are specialized (EQUALS /
IS_NONE), containers are guarded on type and length or keys and wrapped item
by item, modules on identity, functions and classes on identity, bound methods
by their parts, any other object on its type. Values without a source are
wrapped without guards.
"""

from __future__ import annotations

import collections
import enum
import gc
import inspect
import types
from collections.abc import Mapping
from typing import Any, cast

import torch

from kiln.capture import checkpointing, library_functions, parallel_modules
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.graph import OutputGraph
from kiln.capture.guard_data import GuardKind
from kiln.capture.model_output import is_model_output
from kiln.capture.source import Source
from kiln.capture.tensor_subclasses import (
    is_dispatch_wrapper,
    is_function_subclass,
    tensor_torch_function,
)
from kiln.capture.torch_functions import (
    CHECKS,
    is_apply,
    is_control_flow,
    is_special,
    is_torch_callable,
    made_by_transform,
)
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import (
    CellValue,
    DictValue,
    DictViewValue,
    ListValue,
    TupleValue,
)
from kiln.capture.values.functions import BoundMethodValue, BuiltinMethodValue, UserFunctionValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorMethodValue, TensorValue

__all__ = ["wrap", "is_namedtuple"]

_ID_MATCHED = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
)


def is_namedtuple(cls: type) -> bool:
    """A namedtuple class built as ``collections.namedtuple`` builds it: ``cls(*fields)``.

    A subclass with its own ``__new__`` (``inspect.Traceback``) takes other arguments,
    so it is an ordinary object to capture.
    """
    if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return False
    owner = next(k for k in cls.__mro__ if "__new__" in vars(k))
    return "_fields" in vars(owner)


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
        plain = type(obj) is torch.Tensor or isinstance(obj, torch.nn.Parameter)
        if not (plain or is_function_subclass(type(obj)) or is_dispatch_wrapper(type(obj))):
            # its __torch_dispatch__ computes what no fake can follow
            raise unsupported("unsupported_value", f"a tensor of type {type(obj).__name__}")
        return out.add_input(source, obj)
    if is_constant(obj):
        if source is not None and type(obj) in (int, float):
            number = out.number_input(source, obj)  # traced as a symbol if it changes
            if number is not None:
                return number
        if source is not None:
            if obj is None:
                out.guard(source, GuardKind.IS_NONE)
            else:
                out.guard(source, GuardKind.EQUALS, obj)
        return ConstantValue(obj, source)
    if type(obj) in (list, tuple) or (isinstance(obj, tuple) and is_namedtuple(type(obj))):
        return _wrap_sequence(out, obj, source)
    plain_dict = isinstance(obj, dict) and _plain_dict_type(type(obj))
    if plain_dict or type(obj) is types.MappingProxyType:  # ``sig.parameters``: read-only
        return _wrap_dict(out, obj, source)
    if isinstance(obj, torch.nn.Module):
        if source is not None and parallel_modules.runs_own_python(obj):
            # by identity alone, never as a tree: DDP's forward sets its own attributes on
            # every call (kiln.guards makes a MODULE_MATCH under a global or cell a tree)
            out.guard(source, GuardKind.ID_MATCH, id(obj))
        elif source is not None:
            out.guard(source, GuardKind.MODULE_MATCH, id(obj))
            # lets kiln.guards check what is read under it by the module stamp, in O(1)
            # (nested trees join the enclosing one's group)
            out.guard(source, GuardKind.MODULE_TREE, obj)
        return ObjectValue(obj, source)
    if isinstance(obj, types.FunctionType):
        if source is not None:
            out.guard(source, GuardKind.ID_MATCH, id(obj))
        if checkpointing.stand_in(obj) is not None:
            return checkpointing.CheckpointValue(obj, source)
        if is_special(obj) or is_torch_callable(obj) or is_control_flow(obj) or obj in CHECKS:
            return ObjectValue(obj, source)
        if _runs_natively(obj) or obj.__module__ == "torch.distributed.distributed_c10d":
            # (c10d's functions are traced when called, but one that breaks runs as it is,
            # not compiled on its own: torch.compile skips them too)
            return ObjectValue(obj, source)
        if made_by_transform(obj) is not None:  # ``batched = vmap(f)``: traced as the transform
            return ObjectValue(obj, source)
        stand_in = library_functions.substitute(obj)
        if stand_in is not None:
            return function_value(stand_in, None)
        if _is_compile_disable_wrapper(obj):
            inner_src = source.attr("__wrapped__") if source is not None else None
            return _wrap(out, obj.__wrapped__, inner_src)  # type: ignore[attr-defined]
        return function_value(obj, source)
    if isinstance(obj, types.MethodType):
        return _wrap_method(out, obj, source)
    if _python_of_jit_function(obj) is not None:
        # the function TorchScript compiled, traced as Python (torch.compile inlines it too)
        if source is not None:
            out.guard(source, GuardKind.ID_MATCH, id(obj))
        inner_src = source.attr("_torchdynamo_inline") if source is not None else None
        return _wrap(out, _python_of_jit_function(obj), inner_src)
    if _is_c_method(obj):
        return _wrap_c_method(out, obj, source)
    if type(obj) in _DICT_VIEWS:
        return _wrap_view(out, obj, source)
    if source is not None:
        if _by_identity(obj):
            out.guard(source, GuardKind.ID_MATCH, id(obj))
        else:
            out.guard(source, GuardKind.TYPE_MATCH, type(obj))
    return ObjectValue(obj, source)


_DICT_VIEWS = {type(getattr({}, kind)()): kind for kind in ("keys", "values", "items")}


def _wrap_view(out: OutputGraph, view: Any, source: Source | None) -> Value:
    """A dict view from the frame: a live view of its dict, read through ``view.mapping``.

    The dict is reached through a read-only proxy, so the trace may read it but not write it
    (a write breaks the graph); the dict read again elsewhere in the frame is this value.
    """
    (d,) = [r for r in gc.get_referents(view) if isinstance(r, dict)]
    known = out.side_effects.known(d)
    if isinstance(known, DictValue):
        return DictViewValue(known, _DICT_VIEWS[type(view)])
    if type(d) is not dict or source is None:
        if source is not None:
            out.guard(source, GuardKind.TYPE_MATCH, type(view))
        return ObjectValue(view, source)
    out.guard(source, GuardKind.TYPE_MATCH, type(view))
    mapping = source.attr("mapping")
    out.guard(mapping, GuardKind.DICT_KEYS, tuple(d))
    items: dict[Any, tuple[Value, Value]] = {}
    for k, v in d.items():
        key: Value = ConstantValue(k) if is_constant(k) else ObjectValue(k)
        items[k] = (key, wrap(out, v, mapping.item(k)))
    value = DictValue(items)
    value.detached = True
    out.side_effects.remember(d, value)
    return DictViewValue(value, _DICT_VIEWS[type(view)])


_TENSOR_TORCH_FUNCTION = vars(torch.Tensor)["__torch_function__"].__func__


def function_value(fn: types.FunctionType, source: Source | None) -> UserFunctionValue:
    """A real Python function; its closure cells are read through ``source`` when known."""
    if fn is _TENSOR_TORCH_FUNCTION:  # ``super().__torch_function__`` in a subclass
        fn, source = cast(types.FunctionType, tensor_torch_function), None
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


def _runs_natively(fn: types.FunctionType) -> bool:
    """Functions called as they are (a graph break), never traced or compiled.

    Functions that look at the call stack must see the program's frames, not Kiln's.
    """
    inner = getattr(fn, "__wrapped__", fn)
    where = (getattr(inner, "__module__", None), getattr(inner, "__name__", None))
    return where in _NATIVE_FUNCTIONS


_NATIVE_FUNCTIONS = frozenset(
    [
        # they read the running frames: under capture these are Kiln's own
        *(("inspect", n) for n in ("stack", "currentframe", "getouterframes", "trace")),
        *(("traceback", n) for n in ("extract_stack", "format_stack", "print_stack", "walk_stack")),
    ]
)


def _python_of_jit_function(obj: Any) -> types.FunctionType | None:
    """The Python function a ``torch.jit.script``/``trace``-made function was compiled from.

    TorchScript computes the same ops as the Python it compiled; tracing that Python puts
    them in the graph, where calling the TorchScript function would break it.
    """
    if not isinstance(obj, torch.jit.ScriptFunction):
        return None
    inner = inspect.getattr_static(obj, "_torchdynamo_inline", None)
    return inner if isinstance(inner, types.FunctionType) else None


def _is_compile_disable_wrapper(fn: types.FunctionType) -> bool:
    """torch's lazy "not under a compiler" wrapper: capture traces the wrapped function."""
    wrapped = getattr(fn, "__wrapped__", None)
    return isinstance(wrapped, types.FunctionType) and fn.__code__.co_filename.endswith(
        ("torch/_compile.py", "torch\\_compile.py")
    )


def _wrap_method(out: OutputGraph, m: types.MethodType, source: Source | None) -> Value:
    """``obj.meth`` of a Python method, guarded as its function and its receiver.

    Every read of ``obj.meth`` makes a new method object, so its identity would
    fail on the next call; ``__func__`` and ``__self__`` decide what it does.
    """
    if is_apply(m):  # ``index = Index.apply`` kept in a variable: the Function, not its body
        return ObjectValue(m, source)
    func = wrap(out, m.__func__, source.attr("__func__") if source is not None else None)
    receiver = _wrap_receiver(out, m.__self__, source)
    return BoundMethodValue(func, receiver, source)


def _wrap_c_method(out: OutputGraph, m: Any, source: Source | None) -> Value:
    """``obj.name`` of a C method (``arr.mean``, ``lst.append``), guarded as its receiver and name.

    A new object on every read, like a Python method; it is ``getattr(__self__,
    __name__)`` (how CPython pickles it), so the receiver's guards and the name
    decide what it does. Methods of tensors and containers are traced as such;
    of other objects a call breaks the graph and reads the method again.
    """
    if source is not None:
        out.guard(source, GuardKind.TYPE_MATCH, type(m))
        out.guard(source.attr("__name__"), GuardKind.EQUALS, m.__name__)
    receiver = _wrap_receiver(out, m.__self__, source)
    if isinstance(receiver, TensorValue):
        return TensorMethodValue(receiver, m.__name__)
    if isinstance(receiver, ConstantValue) or _by_identity(m.__self__):
        return ObjectValue(m, source)  # the receiver is guarded by value or identity
    return BuiltinMethodValue(receiver, m.__name__)


def _wrap_receiver(out: OutputGraph, owner: Any, method: Source | None) -> Value:
    """The ``__self__`` of a bound method read from ``method``."""
    src = method.attr("__self__") if method is not None else None
    receiver = wrap(out, owner, src)
    if src is not None and receiver.source != src and _by_identity(owner):
        # the object was met before through another path: pin this one to it too
        out.guard(src, GuardKind.ID_MATCH, id(owner))
    return receiver


def _is_c_method(obj: Any) -> bool:
    """Whether ``obj`` is a C method bound to the object or class it was read from.

    Not: functions of C modules, and C callables bound to a private record
    (pybind11), which are stable objects guarded by identity.
    """
    if not isinstance(obj, (types.BuiltinMethodType, types.MethodWrapperType)):
        return False
    owner = obj.__self__
    if owner is None or isinstance(owner, types.ModuleType):
        return False
    static = inspect.getattr_static(owner, obj.__name__, None)
    try:
        if isinstance(static, types.ClassMethodDescriptorType):
            bound = static.__get__(None, owner if isinstance(owner, type) else type(owner))
        elif isinstance(static, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            bound = static.__get__(owner, type(owner))
        else:
            return False
    except TypeError:
        return False
    return bool(bound == obj)


def _by_identity(obj: Any) -> bool:
    """Objects guarded by identity: the same object on every call, or nothing works."""
    return isinstance(obj, (*_ID_MATCHED, torch.nn.Module)) or _is_singleton(obj)


def _is_singleton(obj: Any) -> bool:
    return obj is NotImplemented or isinstance(obj, (torch.finfo, torch.iinfo, enum.Enum))


def _plain_dict_type(cls: type) -> bool:
    """Dicts traced item by item. A dict subclass whose reads are dict's own and that only
    observes writes (a class attribute ``__kiln_plain_dict__ = True``: the module dicts that
    kiln.guards watches) is traced as a plain dict; its type is still guarded."""
    if cls in (dict, collections.OrderedDict) or cls.__dict__.get("__kiln_plain_dict__"):
        return True
    return is_model_output(cls)


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


def _wrap_dict(out: OutputGraph, obj: Mapping[Any, Any], source: Source | None) -> Value:
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
    cls = type(obj)
    if cls.__dict__.get("__kiln_plain_dict__"):  # the builtin dict type it stands for
        cls = next(c for c in cls.__mro__ if c in (collections.OrderedDict, dict))
    d = DictValue(items, cls, source)
    d.detached = source is None or cls is types.MappingProxyType
    return d
