"""The attribute protocol of Python classes, as ``object.__getattribute__`` follows it.

Lookups in a class's MRO (never its metaclass), which descriptors are data descriptors (they
win over an instance's own attribute), and the Python code a descriptor read or a store runs
(a user ``__get__``/``__set__``, a property's setter, ``functools.cached_property``), inlined so
the trace follows it. ``attributes`` applies these to instances made in the trace and to real
objects from the frame.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import TYPE_CHECKING, Any

from kiln.capture import dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.guard_data import GuardKind
from kiln.capture.values.base import Value
from kiln.capture.values.objects import NewObjectValue, ObjectValue
from kiln.capture.wrap import function_value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "INLINED",
    "MISSING",
    "class_lookup",
    "class_static",
    "class_static_unless",
    "descriptor_get",
    "guard_not_shadowed",
    "is_data_descriptor",
    "python_setter",
]


MISSING: Any = object()

# what a class holds whose code a trace inlines (a data descriptor of C runs natively): each
# such read is guarded on the class (GuardKind.CLASS_ATTR)
INLINED = (types.FunctionType, property, classmethod, staticmethod)


def class_lookup(cls: type, name: str) -> Any:
    """``name`` in the dicts of ``cls``'s MRO (not its metaclass), as instance lookup sees it."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return MISSING


_MRO = type.__dict__["__mro__"]  # what getattr_static reads: no metaclass's __mro__
_TYPE_DICT = type.__dict__


def class_static_unless(cls: type, name: str, inherited: Any, default: Any = MISSING) -> Any:
    """``class_static(cls, name, default)``, answered at once where C's cached lookup of
    ``cls.name`` finds ``inherited`` (a function or slot wrapper, which a class lookup gives as
    itself): most classes keep object's ``__getattribute__`` and Module's ``__call__``, and
    then no walk of the bases is needed."""
    if getattr(cls, name, MISSING) is inherited:
        return inherited
    return class_static(cls, name, default)


def class_static(cls: type, name: str, default: Any = MISSING) -> Any:
    """``inspect.getattr_static(cls, name, default)`` for a class (``default`` omitted: raise).

    Along the MRO's classes that are instances of ``type`` itself (no metaclass to shadow
    ``__dict__``), getattr_static's answer is the first of their dicts to hold ``name``, else,
    where all are, ``type``'s (the metaclass's MRO; ``object`` ends every MRO): read here
    directly, and by getattr_static from the first other class on. Capture asks this for most
    attribute reads and calls, and getattr_static walks every metaclass's MRO each time."""
    if type(cls) is type:
        for klass in _MRO.__get__(cls):
            if type(klass) is not type:
                break
            held = klass.__dict__
            if name in held:
                return held[name]
        else:
            if name in _TYPE_DICT:
                return _TYPE_DICT[name]
            if default is MISSING:
                raise AttributeError(name)
            return default
    found = inspect.getattr_static(cls, name, default)
    if found is MISSING:
        raise AttributeError(name)
    return found


def is_data_descriptor(d: Any) -> bool:
    """Whether ``d`` has ``__set__``: it wins over an instance attribute of its name."""
    return d is not None and hasattr(type(d), "__set__")


def descriptor_get(tr: Tracer, v: NewObjectValue, cls: type, name: str, static: Any) -> Value:
    """A descriptor's value for an instance made in the trace: its Python ``__get__`` inlined.

    ``functools.cached_property`` computes once and stores the result in the instance's dict,
    where the next read finds it before the (non-data) descriptor.
    """
    if isinstance(static, functools.cached_property) and isinstance(
        static.func, types.FunctionType
    ):
        value = dispatch.call(tr, function_value(static.func, None), [v], {})
        v.attrs[static.attrname or name] = value
        return value
    getter = class_lookup(type(static), "__get__")
    if not isinstance(getter, types.FunctionType):
        raise unsupported("unsupported_attribute", f"descriptor {cls.__name__}.{name}")
    args = [ObjectValue(static), v, ObjectValue(cls)]
    return dispatch.call(tr, function_value(getter, None), args, {})


def python_setter(cls: type, name: str) -> list[Value] | None:
    """The Python code that ``obj.name = value`` runs through a data descriptor of ``cls``.

    A property's ``fset`` (called with the instance and value) or a descriptor's ``__set__``
    (called with the descriptor first); None where ``name`` is no such descriptor. A property
    without a setter raises AttributeError, as assigning to it does.
    """
    static = class_lookup(cls, name)
    if isinstance(static, property):
        if static.fset is None:
            msg = f"property {name!r} of {cls.__name__!r} object has no setter"
            raise raised(AttributeError(msg))
        if isinstance(static.fset, types.FunctionType):
            return [function_value(static.fset, None)]
        return None
    setter = class_lookup(type(static), "__set__") if static is not MISSING else None
    if isinstance(setter, types.FunctionType):
        return [function_value(setter, None), ObjectValue(static)]
    return None


def guard_not_shadowed(tr: Tracer, v: ObjectValue, name: str, descriptor: Any) -> None:
    """Guard that the instance's own ``__dict__`` still lacks ``name``.

    What the trace found on the class (a method, another non-data descriptor) or its missing
    name (``descriptor`` MISSING: ``__getattr__`` ran) loses to an instance attribute of that
    name set after the call (``a.f = other``); a missing name, also to one set on the class
    later. A data descriptor wins over the instance's dict, and an object without a
    ``__dict__`` cannot be given one: those need no guard.
    """
    if v.source is None or is_data_descriptor(descriptor):
        return
    if descriptor is MISSING:
        found = hasattr(type(v.obj), name)
        tr.out.guard(v.source.attr("__class__"), GuardKind.HASATTR, (name, found))
    if isinstance(getattr(v.obj, "__dict__", None), dict):
        tr.out.guard(v.source, GuardKind.NOT_IN_INSTANCE_DICT, name)
