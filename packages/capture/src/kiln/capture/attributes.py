"""Attribute and item access on tracked values: ``x.name``, ``x[i]`` and their stores.

Reads of real objects are specialized: the attribute's value is wrapped with
an :class:`~kiln.capture.source.AttrSource` (so it is guarded), methods become
bound method values to inline, properties are inlined. ``nn.Module`` reads
look in ``_parameters``, ``_buffers`` and ``_modules`` first, as Module does.

Each handler here is registered in :mod:`~kiln.capture.dispatch` for the value kinds it serves;
callers go through ``dispatch.get_attr`` and friends, never through this module.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import autograd_function, builtin_types, dispatch, literals
from kiln.capture.breaks.reasons import UserException, raised, unsupported
from kiln.capture.descriptors import (
    INLINED,
    MISSING,
    class_lookup,
    class_static,
    class_static_unless,
    descriptor_get,
    guard_not_shadowed,
    is_data_descriptor,
    python_setter,
)
from kiln.capture.guard_data import GuardKind
from kiln.capture.model_output import is_model_output
from kiln.capture.side_effects import log_at
from kiln.capture.source import MODULE_STORES, Source
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, SetValue, TupleValue
from kiln.capture.values.functions import (
    BoundMethodValue,
    BuiltinMethodValue,
    PartialValue,
    ReplayedCallValue,
    UserFunctionValue,
)
from kiln.capture.values.objects import (
    InstanceDictValue,
    NewObjectValue,
    ObjectValue,
    SuperValue,
)
from kiln.capture.values.tensor import TensorMethodValue, TensorValue
from kiln.capture.wrap import function_value, wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "class_attr",
    "module_state_source",
    "plain_new_object_attr",
    "plain_object_attr",
]


# ``v.name`` by kind; tensors' and ndarrays' are registered by torch_calls and numpy_calls.
@dispatch.GET_ATTR.register(Value)
def _value_attr(tr: Tracer, v: Value, name: str) -> Value:
    found = builtin_types.instance_attr(tr, v, name)  # ``self.extra`` of a list subclass
    if found is not None:
        return found
    own = builtin_types.python_method(tr, v, name)  # ``class Registry(set)``'s methods
    return own if own is not None else _builtin_method(v, name)


@dispatch.GET_ATTR.register(NewObjectValue)
def _new_object_attr(tr: Tracer, v: NewObjectValue, name: str) -> Value:
    custom = class_lookup(v.cls, "__getattribute__")
    if isinstance(custom, types.FunctionType):
        return dispatch.call(tr, function_value(custom, None), [v, ConstantValue(name)], {})
    return plain_new_object_attr(tr, v, name)


def plain_new_object_attr(tr: Tracer, v: NewObjectValue, name: str) -> Value:
    """``object.__getattribute__`` on an instance made in the trace, in Python's order.

    A data descriptor of the class (a property, a descriptor with ``__set__``) wins over the
    instance's own attribute of the same name, which wins over everything else the class has.
    """
    if name in ("__class__", "__dict__"):
        return ObjectValue(v.cls) if name == "__class__" else InstanceDictValue(v)
    static = class_lookup(v.cls, name)
    slot = isinstance(static, types.MemberDescriptorType)  # ``__slots__`` live in ``attrs``
    if name in v.attrs and (slot or not is_data_descriptor(static)):
        return v.attrs[name]
    if static is MISSING or slot:
        return _missing_attr(tr, v, name)
    return class_attr(tr, v, v.cls, name, None, static)


@dispatch.GET_ATTR.register(ConstantValue)
def _constant_attr(tr: Tracer, v: ConstantValue, name: str) -> Value:
    try:
        result = getattr(v.value, name)
    except AttributeError as e:
        raise raised(e) from e
    if is_constant(result):
        return ConstantValue(result)
    return ObjectValue(result)


@dispatch.GET_ATTR.register(DictValue)
def _dict_attr(tr: Tracer, v: DictValue, name: str) -> Value:
    found = builtin_types.instance_attr(tr, v, name)
    if found is not None:
        return found
    own = builtin_types.python_method(tr, v, name)  # ``class Registry(dict)``'s methods
    if own is not None:
        return own
    if name in v.items and is_model_output(v.cls):
        return v.items[name][1]
    if is_model_output(v.cls):
        field_names = {f.name for f in dataclasses.fields(v.cls)}
        if name in field_names:
            return ConstantValue(None)
    return _builtin_method(v, name)


@dispatch.GET_ATTR.register(TupleValue)
def _tuple_attr(tr: Tracer, v: TupleValue, name: str) -> Value:
    own = builtin_types.python_method(tr, v, name)
    if own is not None:
        return own
    fields = getattr(v.cls, "_fields", None)
    if fields is not None and name in fields:
        return v.items[fields.index(name)]
    if hasattr(v.cls, "n_fields") and isinstance(
        getattr(v.cls, name, None), types.MemberDescriptorType
    ):
        return v.items[list(_structseq_fields(v.cls)).index(name)]
    return _builtin_method(v, name)


@dispatch.GET_ATTR.register(BuiltinMethodValue, TensorMethodValue)
def _method_attr(tr: Tracer, v: BuiltinMethodValue | TensorMethodValue, name: str) -> Value:
    if name in ("__self__", "__name__"):
        return v.receiver if name == "__self__" else ConstantValue(v.name)
    return _builtin_method(v, name)


@dispatch.GET_ATTR.register(PartialValue)
def _partial_attr(tr: Tracer, v: PartialValue, name: str) -> Value:
    if name == "func":
        return v.func
    if name in ("args", "keywords"):
        return TupleValue(list(v.args)) if name == "args" else _kwargs_dict(v.kwargs)
    if not _class_defines(functools.partial, name):  # ``__name__`` is the class's alone
        raise raised(AttributeError(f"'functools.partial' object has no attribute {name!r}"))
    return _builtin_method(v, name)


def _class_defines(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` get ``name`` from their class (not from its metaclass)."""
    return any(name in vars(k) for k in cls.__mro__)


def _kwargs_dict(kwargs: dict[str, Value]) -> DictValue:
    return DictValue({k: (ConstantValue(k), x) for k, x in kwargs.items()})


def _structseq_fields(cls: type) -> list[str]:
    return [n for n, d in vars(cls).items() if isinstance(d, types.MemberDescriptorType)]


def _builtin_method(v: Value, name: str) -> Value:
    cls = v.python_type()
    if callable(getattr(cls, name, None)):
        return BuiltinMethodValue(v, name)
    raise unsupported("unsupported_attribute", f"{cls.__name__}.{name}")


@dispatch.GET_ATTR.register(BoundMethodValue)
def _bound_method_attr(tr: Tracer, v: BoundMethodValue, name: str) -> Value:
    if name == "__self__":
        return v.self_value
    if name == "__func__":
        return v.func
    return dispatch.get_attr(tr, v.func, name)  # a method passes other reads on to its function


@dispatch.GET_ATTR.register(UserFunctionValue)
def _function_attr(tr: Tracer, v: UserFunctionValue, name: str) -> Value:
    if v.real is not None:
        src = v.source.attr(name) if v.source is not None else None
        return wrap(tr.out, getattr(v.real, name), src)
    if name in ("__name__", "__qualname__"):
        return ConstantValue(getattr(v.code, f"co_{name.strip('_')}"))
    raise unsupported("unsupported_attribute", f"function.{name}")


@dispatch.GET_ATTR.register(ObjectValue)
def _object_attr(tr: Tracer, v: ObjectValue, name: str) -> Value:
    custom = class_static_unless(type(v.obj), "__getattribute__", object.__getattribute__, None)
    if isinstance(custom, types.FunctionType):
        return dispatch.call(tr, function_value(custom, None), [v, ConstantValue(name)], {})
    return plain_object_attr(tr, v, name)


_LOGGER_QUERIES = frozenset({"isEnabledFor", "getEffectiveLevel", "hasHandlers", "getChild"})
_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def plain_object_attr(tr: Tracer, v: ObjectValue, name: str) -> Value:
    """``object.__getattribute__(v, name)``, then ``__getattr__`` when that fails."""
    obj = v.obj
    if isinstance(obj, logging.Logger) and name not in _LOGGER_QUERIES:
        method = getattr(obj, name, None)
        if name in _LOG_LEVELS and getattr(type(obj), name) is getattr(logging.Logger, name):
            return ReplayedCallValue(functools.partial(log_at, obj, _LOG_LEVELS[name]), True)
        if callable(method):  # ``warning_once`` and other helpers: called as they are
            return ReplayedCallValue(method)
    pending = tr.out.side_effects.pending_attr(obj, name)
    if pending is not None:
        return pending
    src = v.source.attr(name) if v.source is not None else None
    if isinstance(obj, torch.nn.Module):
        for store in MODULE_STORES:
            table = obj.__dict__.get(store)
            if table is not None and name in table:
                return wrap(tr.out, table[name], module_state_source(v.source, store, name))
    if isinstance(obj, (types.ModuleType, type)):
        return _class_or_module_attr(tr, v, name, src)
    in_dict = name in getattr(obj, "__dict__", {})
    descriptor = class_static(type(obj), name, None)
    if in_dict and not is_data_descriptor(descriptor):  # before getattr_static's slower walk
        return wrap(tr.out, obj.__dict__[name], src)
    try:
        static = inspect.getattr_static(obj, name)
    except AttributeError:
        guard_not_shadowed(tr, v, name, MISSING)
        return _missing_attr(tr, v, name)
    guard_not_shadowed(tr, v, name, descriptor)
    return class_attr(tr, v, type(obj), name, src, static)


def module_state_source(src: Source | None, store: str, name: str) -> Source | None:
    """How emitted code and guards reload a parameter, buffer or submodule ``name``.

    ``L['self']._parameters['weight']`` rather than ``L['self'].weight``: the value is read
    straight from the dict it lives in, where the attribute goes through the Python-level
    ``Module.__getattr__``, paid for every parameter on every call of the output code). Capture resolved the name in that dict, so both read the same object.
    """
    return src.attr(store).item(name) if src is not None else None


def _missing_attr(tr: Tracer, v: ObjectValue | NewObjectValue, name: str) -> Value:
    cls = v.python_type()
    getattr_fn = class_lookup(cls, "__getattr__")
    if isinstance(getattr_fn, types.FunctionType) and not issubclass(cls, torch.nn.Module):
        return dispatch.call(tr, function_value(getattr_fn, None), [v, ConstantValue(name)], {})
    raise raised(AttributeError(f"{cls.__name__!r} object has no attribute {name!r}"))


def class_attr(
    tr: Tracer,
    v: Value,
    cls: type,
    name: str,
    src: Source | None,
    static: Any = None,
) -> Value:
    """An attribute found on the class of an instance ``v``: methods bind, properties run."""
    if static is None:
        try:
            static = class_static(cls, name)
        except AttributeError:
            if isinstance(v, NewObjectValue):
                getattr_fn = class_static(cls, "__getattr__", None)
                if isinstance(getattr_fn, types.FunctionType):
                    return dispatch.call(
                        tr, function_value(getattr_fn, None), [v, ConstantValue(name)], {}
                    )
            raise raised(
                AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")
            ) from None
    if isinstance(static, INLINED):
        tr.out.guard_class_attr(cls, name)
    if isinstance(static, types.FunctionType):
        fn_src = src.attr("__func__") if src is not None else None
        return BoundMethodValue(function_value(static, fn_src), v)
    if builtin_types.descriptor(static) is not None:  # ``reg.keys`` of a dict subclass
        return BoundMethodValue(ObjectValue(static), v)
    if isinstance(static, property):
        if not isinstance(static.fget, types.FunctionType):
            return _real_attr(tr, v, name, src)
        # the getter's globals are guarded through the class: L['x'].__class__.name.fget
        fget_src = v.source.attr("__class__").attr(name).attr("fget") if v.source else None
        return dispatch.call(tr, function_value(static.fget, fget_src), [v], {})
    if isinstance(static, classmethod):
        return BoundMethodValue(_callable_value(static.__func__), ObjectValue(cls))
    if isinstance(static, staticmethod):
        return _callable_value(static.__func__)
    if isinstance(v, NewObjectValue) and hasattr(type(static), "__get__"):
        if isinstance(
            static,
            (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType),
        ):
            return ObjectValue(static)
        return descriptor_get(tr, v, cls, name, static)
    return _real_attr(tr, v, name, src)


def _real_attr(tr: Tracer, v: Value, name: str, src: Source | None) -> Value:
    if isinstance(v, ObjectValue):
        try:
            return wrap(tr.out, getattr(v.obj, name), src)
        except AttributeError as e:
            raise raised(e) from e
    cls = v.python_type()
    return wrap(tr.out, getattr(cls, name), None)


def _class_or_module_attr(tr: Tracer, v: ObjectValue, name: str, src: Source | None) -> Value:
    obj = v.obj
    if isinstance(obj, type):
        try:
            static = inspect.getattr_static(obj, name)
        except AttributeError:
            raise raised(AttributeError(f"{obj.__name__} has no attribute {name!r}")) from None
        if isinstance(static, INLINED):
            tr.out.guard_class_attr(obj, name)
        if isinstance(static, classmethod) and isinstance(static.__func__, types.FunctionType):
            bound = getattr(obj, name)
            if autograd_function.is_apply(bound):  # torch's own, in Python on some versions
                return ObjectValue(bound)
            return BoundMethodValue(_callable_value(static.__func__), v)
        if isinstance(static, staticmethod) and isinstance(static.__func__, types.FunctionType):
            return function_value(static.__func__, src)
    try:
        return wrap(tr.out, getattr(obj, name), src)
    except AttributeError as e:
        raise raised(e) from e


@dispatch.GET_ATTR.register(SuperValue)
def _super_attr(tr: Tracer, v: SuperValue, name: str) -> Value:
    owner = v.obj.obj if isinstance(v.obj, ObjectValue) else None
    # ``super()`` in ``__new__`` or a classmethod walks the class's own MRO
    own_class = isinstance(owner, type) and issubclass(owner, v.cls)
    mro = (owner if isinstance(owner, type) and own_class else v.obj.python_type()).__mro__
    start = mro.index(v.cls) + 1 if v.cls in mro else len(mro)
    for klass in mro[start:]:
        if name in klass.__dict__:
            static = klass.__dict__[name]
            if isinstance(static, INLINED):
                tr.out.guard_class_attr(klass, name)
            if isinstance(static, types.FunctionType):
                return BoundMethodValue(function_value(static, None), v.obj)
            if isinstance(static, property) and isinstance(static.fget, types.FunctionType):
                return dispatch.call(tr, function_value(static.fget, None), [v.obj], {})
            if isinstance(static, classmethod):  # bound to the class it is read through
                cls_v = v.obj if own_class else ObjectValue(v.obj.python_type())
                return BoundMethodValue(_callable_value(static.__func__), cls_v)
            if isinstance(static, staticmethod):
                return _callable_value(static.__func__)
            if name == "__init__" and klass is object:
                return ObjectValue(_noop_init)
            if name == "__new__":  # a static method: the class is passed explicitly
                return ObjectValue(static)
            if callable(static):
                return _SlotWrapper(static, v.obj)
            return wrap(tr.out, static, None)
    raise raised(AttributeError(f"'super' object has no attribute {name!r}"))


def _callable_value(fn: Any) -> Value:
    return function_value(fn, None) if isinstance(fn, types.FunctionType) else ObjectValue(fn)


def _noop_init(*args: Any, **kwargs: Any) -> None:
    """``object.__init__`` reached through ``super()``: nothing to do."""


class _SlotWrapper(BoundMethodValue):
    """A C-level method reached through ``super()`` (``dict.__init__`` and friends)."""

    def __init__(self, method: Any, self_value: Value) -> None:
        super().__init__(ObjectValue(method), self_value)


# ``hasattr(v, name)`` by kind, without running user code that is not inlined; tensors' is
# registered by torch_calls.
@dispatch.HAS_ATTR.register(Value)
def _value_has_attr(tr: Tracer, v: Value, name: str) -> bool:
    return _class_defines(v.python_type(), name)


@dispatch.HAS_ATTR.register(NewObjectValue)
def _new_object_has_attr(tr: Tracer, v: NewObjectValue, name: str) -> bool:
    static = class_lookup(v.cls, name)
    computed = isinstance(static, (property, types.MemberDescriptorType)) or isinstance(
        class_lookup(type(static), "__get__"), types.FunctionType
    )  # these may raise AttributeError: try them
    hooked = isinstance(class_lookup(v.cls, "__getattribute__"), types.FunctionType)
    if not hooked and (name in v.attrs or (static is not MISSING and not computed)):
        return True
    return _getattr_hook_finds(tr, v, name)


@dispatch.HAS_ATTR.register(ObjectValue)
def _object_has_attr(tr: Tracer, v: ObjectValue, name: str) -> bool:
    if tr.out.side_effects.pending_attr(v.obj, name) is not None:
        return True
    if _has_python_getattr(v.obj) and not hasattr(type(v.obj), name):
        return _getattr_hook_finds(tr, v, name)
    found = hasattr(v.obj, name)
    if v.source is not None:
        tr.out.guard(v.source, GuardKind.HASATTR, (name, found))
    return found


@dispatch.HAS_ATTR.register(ConstantValue)
def _constant_has_attr(tr: Tracer, v: ConstantValue, name: str) -> bool:
    return hasattr(v.value, name)


@dispatch.HAS_ATTR.register(DictValue)
def _dict_has_attr(tr: Tracer, v: DictValue, name: str) -> bool:
    if is_model_output(v.cls):  # a ModelOutput's fields are its items
        return name in v.items or hasattr(v.cls, name)
    return _class_defines(v.cls, name)


@dispatch.HAS_ATTR.register(UserFunctionValue)
def _function_has_attr(tr: Tracer, v: UserFunctionValue, name: str) -> bool:
    if v.real is not None:
        return hasattr(v.real, name)
    return _class_defines(v.python_type(), name)


@dispatch.HAS_ATTR.register(BoundMethodValue)
def _method_has_attr(tr: Tracer, v: BoundMethodValue, name: str) -> bool:
    # a method passes other reads on to its function
    return _class_defines(types.MethodType, name) or dispatch.has_attr(tr, v.func, name)


# ``del v.name`` by kind: only on objects the trace created or owns privately.
@dispatch.DELETE_ATTR.register(Value)
def _delete_attr(tr: Tracer, v: Value, name: str) -> None:
    raise unsupported("side_effect", f"deleting the attribute {name!r} of {v}")


@dispatch.DELETE_ATTR.register(NewObjectValue)
def _delete_new_object_attr(tr: Tracer, v: NewObjectValue, name: str) -> None:
    if name in v.attrs:
        del v.attrs[name]
    else:
        _delete_attr(tr, v, name)


@dispatch.DELETE_ATTR.register(ObjectValue)
def _delete_object_attr(tr: Tracer, v: ObjectValue, name: str) -> None:
    if not v.private:
        _delete_attr(tr, v, name)
        return
    try:
        delattr(v.obj, name)
    except AttributeError as e:
        raise raised(e) from e


def _has_python_getattr(obj: Any) -> bool:
    hook = class_static(type(obj), "__getattr__", None)
    return isinstance(hook, types.FunctionType) and not isinstance(obj, torch.nn.Module)


def _getattr_hook_finds(tr: Tracer, v: Value, name: str) -> bool:
    """Whether a Python ``__getattr__`` produces ``name``: tried, then rolled back.

    Like ``hasattr``, this runs the lookup and catches AttributeError; the
    attempt's graph nodes are dropped so only the real read later stays.
    """
    cp = tr.checkpoint()
    try:
        dispatch.get_attr(tr, v, name)
    except UserException as e:
        if not isinstance(e.exc, AttributeError):
            raise
        tr.rollback(cp)
        return False
    tr.rollback(cp)
    return True


# ``v.name = value`` by kind (``plain``: ``object.__setattr__``, skipping a class's own hook).
# Objects created during the trace are updated in place; stores to objects from the frame are
# recorded and replayed after the graph.
@dispatch.SET_ATTR.register(Value)
def _set_attr(tr: Tracer, v: Value, name: str, value: Value, plain: bool) -> None:
    raise unsupported("side_effect", f"setting attribute {name!r} of {v}")


@dispatch.SET_ATTR.register(NewObjectValue)
def _set_new_object_attr(
    tr: Tracer, v: NewObjectValue, name: str, value: Value, plain: bool
) -> None:
    if not plain:
        custom = class_lookup(v.cls, "__setattr__")
        if isinstance(custom, types.FunctionType):
            dispatch.call(tr, function_value(custom, None), [v, ConstantValue(name), value], {})
            return
    static = class_lookup(v.cls, name)
    if not is_data_descriptor(static) or isinstance(static, types.MemberDescriptorType):
        v.attrs[name] = value
        return
    setter = python_setter(v.cls, name)
    if setter is None:
        raise unsupported("unsupported_attribute", f"descriptor {v.cls.__name__}.{name}")
    dispatch.call(tr, setter[0], [*setter[1:], v, value], {})


@dispatch.SET_ATTR.register(DictValue)
def _set_dict_attr(tr: Tracer, v: DictValue, name: str, value: Value, plain: bool) -> None:
    none = isinstance(value, ConstantValue) and value.is_none()
    model_output = is_model_output(v.cls) and v.source is None
    if model_output and none and name not in v.items:
        return  # a field that is not an item reads as None already
    if model_output and builtin_types.item_store(v, name, value):
        v.items[name] = (ConstantValue(name), value)  # a ModelOutput's fields are its items
    else:
        _set_container_attr(tr, v, name, value, plain)


@dispatch.SET_ATTR.register(ListValue, SetValue)
def _set_container_attr(
    tr: Tracer, v: DictValue | ListValue | SetValue, name: str, value: Value, plain: bool
) -> None:
    if not builtin_types.set_instance_attr(tr, v, name, value, plain):
        _set_attr(tr, v, name, value, plain)


@dispatch.SET_ATTR.register(ObjectValue)
def _set_object_attr(tr: Tracer, v: ObjectValue, name: str, value: Value, plain: bool) -> None:
    if not plain and not isinstance(v.obj, torch.nn.Module):
        custom = class_static(type(v.obj), "__setattr__", None)
        if isinstance(custom, types.FunctionType):
            dispatch.call(tr, function_value(custom, None), [v, ConstantValue(name), value], {})
            return
    setter = python_setter(type(v.obj), name)
    if setter is not None and (v.source is not None or v.private):
        dispatch.call(tr, setter[0], [*setter[1:], v, value], {})  # its stores are recorded
    elif v.source is not None and (
        _plain_attribute(v.obj, name, plain) or _buffer_rebinding(v.obj, name, value)
    ):
        tr.out.side_effects.store_attr(v, v.obj, name, value)
    elif v.private and literals.is_literal(value):
        # nothing outside the trace can see this object: update the real one now
        object.__setattr__(v.obj, name, literals.literal(value))
    else:
        _set_attr(tr, v, name, value, plain)


def _buffer_rebinding(obj: Any, name: str, value: Value) -> bool:
    """Whether ``module.name = value`` rebinds a registered buffer to a tensor or None.

    ``Module.__setattr__`` puts the new value in ``_buffers``; replaying the store with
    ``setattr`` after the graph does the same, and reads later in the trace see the
    pending value (a buffer moved with ``.to`` in ``forward``).
    """
    if (
        not isinstance(obj, torch.nn.Module)
        or type(obj).__setattr__ is not torch.nn.Module.__setattr__
    ):
        return False
    if name not in obj.__dict__.get("_buffers", {}):
        return False
    return isinstance(value, TensorValue) or (isinstance(value, ConstantValue) and value.is_none())


def _plain_attribute(obj: Any, name: str, plain: bool) -> bool:
    """Whether ``obj.name = value`` only writes the instance dict (no descriptor, no module slot)."""
    if isinstance(obj, (type, types.ModuleType)) or not hasattr(obj, "__dict__"):
        return False
    if is_data_descriptor(class_static(type(obj), name, None)):
        return False
    if isinstance(obj, torch.nn.Module):
        if any(name in obj.__dict__.get(store, {}) for store in MODULE_STORES):
            return False
        return type(obj).__setattr__ is torch.nn.Module.__setattr__
    setter: Any = type(obj).__setattr__
    return plain or setter is object.__setattr__
