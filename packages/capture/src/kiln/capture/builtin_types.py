"""Subclasses of dict, list and tuple, and builtin-type methods called on them.

A class such as ``class Registry(dict)`` mixes Python methods with the builtin
container's C methods: its own ``get`` calls ``super().get(key)``, or code calls
``dict.get(obj, key)`` directly. Capture follows both:

- instances made in the trace are tracked containers (:class:`DictValue`,
  :class:`ListValue`) whose ``cls`` is the subclass; attribute reads and the
  operators (``d[k]``, ``k in d``, ``len``, ``iter``) run the subclass's Python
  methods where it defines them (:func:`python_method`) and the container's
  behaviour otherwise;
- the builtin types' method descriptors and slot wrappers (``dict.get``,
  ``list.__getitem__``, ``dict.__setitem__``), reached through ``super()`` or
  the type, are evaluated on the tracked container (:func:`call_descriptor`);
- a real instance from the frame (an object capture does not track as a
  container) is read through :func:`snapshot`: its items, guarded on keys or
  length like a plain dict or list, and read-only (a mutation breaks the graph).
"""

from __future__ import annotations

import collections
import inspect
import types
from typing import TYPE_CHECKING, Any

from kiln.capture import container_methods, dispatch
from kiln.capture.breaks.reasons import raised, unsupported
from kiln.capture.descriptors import MISSING, class_lookup, is_data_descriptor, python_setter
from kiln.capture.guard_data import GuardKind
from kiln.capture.model_output import is_model_output, is_model_output_base, written_by_dataclass
from kiln.capture.source import RawItemSource, Source
from kiln.capture.values.base import ConstantValue, Value, is_constant
from kiln.capture.values.containers import DictValue, ListValue, SetValue, TupleValue, dict_key
from kiln.capture.values.functions import BoundMethodValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.wrap import function_value, is_namedtuple, wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "call_descriptor",
    "call_override",
    "construct",
    "descriptor",
    "instance_attr",
    "item_store",
    "new_tuple",
    "python_method",
    "set_instance_attr",
    "snapshot",
]

_BASES: tuple[type, ...] = (collections.OrderedDict, dict, list, tuple, set, frozenset)
# what the emitted code and the guards run on a snapshot's source: overridden, they differ
_READ_PROTOCOL = ("__iter__", "__len__", "keys")


def _is_builtin(klass: type) -> bool:
    return klass in _BASES or klass is object


def _subclass(cls: type) -> bool:
    """A Python subclass of a builtin container (transformers' ModelOutputs, named tuples
    and structseqs such as ``torch.return_types.max`` excepted: capture models their fields)."""
    return (
        cls not in _BASES
        and issubclass(cls, _BASES)
        and not is_model_output(cls)
        and not hasattr(cls, "_fields")
        and not hasattr(cls, "n_fields")
    )


def python_method(tr: Tracer, v: Value, name: str) -> Value | None:
    """``v.name`` when ``v``'s class defines ``name`` in Python above its builtin base."""
    cls = v.python_type()
    modeled = is_model_output(cls)  # ModelOutput's own methods: capture knows what they do
    if isinstance(v, TupleValue) and is_namedtuple(cls):
        if name in _NAMEDTUPLE_METHODS:  # tuple.__new__ inside: as a constructor call
            return BoundMethodValue(function_value(_NAMEDTUPLE_METHODS[name], None), v)
    elif not isinstance(v, (DictValue, ListValue, TupleValue, SetValue)) or not (
        modeled or _subclass(cls)
    ):
        return None
    for klass in cls.__mro__:
        if _is_builtin(klass) or (modeled and is_model_output_base(klass)):
            return None
        if name in vars(klass):
            static = vars(klass)[name]
            if modeled and (written_by_dataclass(static) or not callable(static)):
                continue  # its fields' __init__, __eq__... and defaults: the fields are items
            if isinstance(static, types.FunctionType):
                return BoundMethodValue(function_value(static, None), v)
            if is_constant(static):
                return ConstantValue(static)
            # plain data the class holds (a dataclass's ``__dataclass_fields__``)
            return None if hasattr(type(static), "__get__") else wrap(tr.out, static, None)
    return None


def _namedtuple_replace(self: Any, /, **changes: Any) -> Any:
    """``nt._replace(**changes)``, through the class's constructor."""
    values = [changes.pop(f, v) for f, v in zip(self._fields, self, strict=True)]
    if changes:
        raise ValueError(f"Got unexpected field names: {list(changes)!r}")
    return type(self)(*values)


def _namedtuple_make(self: Any, iterable: Any) -> Any:
    """``NT._make(iterable)`` read through an instance."""
    return type(self)(*iterable)


_NAMEDTUPLE_METHODS: dict[str, Any] = {"_replace": _namedtuple_replace, "_make": _namedtuple_make}


def _own_attrs(v: Value) -> dict[str, Value] | None:
    """The instance attributes of a dict, list or set subclass instance made in the trace."""
    if not isinstance(v, (DictValue, ListValue, SetValue)) or v.source is not None or v.detached:
        return None
    has_dict = getattr(v.cls, "__dictoffset__", 0) != 0  # no ``__slots__`` in the way
    return v.attrs if has_dict and _subclass(v.cls) else None


def instance_attr(tr: Tracer, v: Value, name: str) -> Value | None:
    """``v.name`` from such an instance's own attributes, or from its class's ``__getattr__``
    when nothing else has ``name``; None where the class's attributes decide."""
    attrs = _own_attrs(v)
    if attrs is None:
        return None
    static = class_lookup(v.python_type(), name)
    if name in attrs and not is_data_descriptor(static):
        return attrs[name]
    hook = python_method(tr, v, "__getattr__")
    if static is MISSING and hook is not None:
        return dispatch.call(tr, hook, [ConstantValue(name)], {})
    return None


def set_instance_attr(tr: Tracer, v: Value, name: str, value: Value, plain: bool) -> bool:
    """``v.name = value`` on such an instance: its class's ``__setattr__`` and data descriptors
    run (inlined), otherwise the attribute is its own; False for other values."""
    attrs = _own_attrs(v)
    if attrs is None:
        return False
    hook = None if plain else python_method(tr, v, "__setattr__")
    setter = python_setter(v.python_type(), name)
    if hook is not None:
        dispatch.call(tr, hook, [ConstantValue(name), value], {})
    elif setter is not None:
        dispatch.call(tr, setter[0], [*setter[1:], v, value], {})
    elif is_data_descriptor(class_lookup(v.python_type(), name)):
        raise unsupported("unsupported_attribute", f"descriptor {v.python_type().__name__}.{name}")
    else:
        attrs[name] = value
    return True


def item_store(v: DictValue, name: str, value: Value) -> bool:
    """Whether ``output.name = value`` on a dict dataclass (a ModelOutput) sets the item too.

    Capture keeps such an object's fields as its items alone. Every ModelOutput-like
    ``__setattr__`` stores a value that is not None under a key the object has; transformers'
    own also adds a field that is not a key yet. Other stores (None, a new key under another
    class's hook) may leave the item and the attribute apart, which capture cannot represent.
    """
    if isinstance(value, ConstantValue) and value.is_none():
        return False
    if name in v.items:
        return True
    hook = class_lookup(v.cls, "__setattr__")
    where = (getattr(hook, "__module__", None), getattr(hook, "__qualname__", None))
    return where == ("transformers.utils.generic", "ModelOutput.__setattr__")


def call_override(tr: Tracer, v: Value, name: str, args: list[Value]) -> Value | None:
    """``type(v).name(v, *args)`` for a Python-level dunder of a container subclass."""
    method = python_method(tr, v, name)
    return dispatch.call(tr, method, args, {}) if method is not None else None


def snapshot(tr: Tracer, v: ObjectValue) -> Value | None:
    """A real dict, list or tuple subclass instance as its items: guarded, read-only.

    The guards iterate it and take its length, so a class overriding those is refused; items
    are reloaded with the builtin type's own ``__getitem__``, past a Python override.
    """
    obj, src = v.obj, v.source
    cls = type(obj)
    if not isinstance(obj, (dict, list, tuple)) or any(
        isinstance(inspect.getattr_static(cls, n, None), types.FunctionType) for n in _READ_PROTOCOL
    ):
        return None
    owner = next(k for k in cls.__mro__ if k in (dict, list, tuple))

    def item(index: Any) -> Source | None:
        if src is None:
            return None
        return (
            RawItemSource(src, index, owner)
            if cls.__getitem__ is not owner.__getitem__
            else src.item(index)
        )

    if isinstance(obj, dict):
        if src is not None:
            tr.out.guard(src, GuardKind.DICT_KEYS, tuple(obj.keys()))
        items: dict[Any, tuple[Value, Value]] = {}
        for k, x in dict.items(obj):
            key = ConstantValue(k) if is_constant(k) else ObjectValue(k)
            items[k] = (key, wrap(tr.out, x, item(k)))
        d = DictValue(items, cls)
        d.detached = True
        return d
    if src is not None:
        tr.out.guard(src, GuardKind.SEQUENCE_LENGTH, len(obj))
    values = [wrap(tr.out, x, item(i)) for i, x in enumerate(obj)]
    if isinstance(obj, tuple):
        return TupleValue(values, cls)
    lst = ListValue(values, cls=cls)
    lst.detached = True
    return lst


def _receiver(tr: Tracer, v: Value, owner: type) -> Value:
    if isinstance(v, ObjectValue) and isinstance(v.obj, owner):
        found = snapshot(tr, v)
        if found is not None:
            return found
    if isinstance(v, (DictValue, ListValue, TupleValue, SetValue)) and issubclass(
        v.python_type(), owner
    ):
        return v
    raise unsupported("unsupported_call", f"{owner.__name__} method on {v}")


def call_descriptor(
    tr: Tracer, owner: type, name: str, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    """``owner.name(receiver, *args)``: a builtin container's method on a tracked container."""
    if not args:
        raise unsupported("unsupported_call", f"{owner.__name__}.{name} without a receiver")
    receiver = _receiver(tr, args[0], owner)
    rest = args[1:]
    if name == "__init__":
        return _init(tr, receiver, rest, kwargs)
    if name == "__iter__":
        return dispatch.iterate(tr, _plain(receiver))
    if name == "__len__":
        return ConstantValue(dispatch.length(tr, _plain(receiver)))
    if name == "__delitem__" and isinstance(receiver, (DictValue, ListValue)):
        receiver.check_mutable()
        if isinstance(receiver, ListValue):
            del receiver.items[int(rest[0].as_constant())]
        elif receiver.items.pop(dict_key(rest[0]), None) is None:
            raise raised(KeyError(dict_key(rest[0])))
        return ConstantValue(None)
    return dispatch.call_method(tr, receiver, name, rest, kwargs)


def _plain(v: Value) -> Value:
    """The same items under the builtin type, so no Python override runs again."""
    if isinstance(v, DictValue):
        return DictValue(v.items)
    if isinstance(v, ListValue):
        return ListValue(v.items)
    if isinstance(v, TupleValue):
        return TupleValue(v.items)
    return v


def _init(tr: Tracer, receiver: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if isinstance(receiver, DictValue):
        filled = container_methods.make_dict(tr, args, kwargs)
        assert isinstance(filled, DictValue)
        receiver.check_mutable()
        receiver.items.clear()
        receiver.items.update(filled.items)
    elif isinstance(receiver, ListValue) and not kwargs:
        receiver.check_mutable()
        receiver.items[:] = dispatch.unpack_iterable(tr, args[0]) if args else []
    elif isinstance(receiver, SetValue) and not kwargs:
        receiver.check_mutable()
        items = dispatch.unpack_iterable(tr, args[0]) if args else []
        receiver.items = {dict_key(x): x for x in items}
    else:
        raise unsupported("unsupported_call", f"__init__ of {receiver}")
    return ConstantValue(None)


def construct(tr: Tracer, cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """``cls(*args)`` for a Python subclass of dict, list, set or tuple; None for other classes."""
    if _subclass(cls) and issubclass(cls, tuple) and type(cls) is type:
        return _construct_tuple(tr, cls, args, kwargs)
    if not _subclass(cls) or not issubclass(cls, (dict, list, set)):
        return None
    if type(cls) is not type or cls.__new__ not in (dict.__new__, list.__new__, set.__new__):
        return None
    instance: Value
    if issubclass(cls, dict):
        instance = DictValue({}, cls)
    else:
        instance = ListValue([], cls=cls) if issubclass(cls, list) else SetValue({}, cls=cls)
    init = python_method(tr, instance, "__init__")
    if init is not None:
        dispatch.call(tr, init, args, kwargs)
    else:
        _init(tr, instance, args, kwargs)
    return instance


def _construct_tuple(tr: Tracer, cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A tuple subclass: its Python ``__new__`` inlined (``tuple.__new__`` inside it makes the
    items), then a Python ``__init__``."""
    new = inspect.getattr_static(cls, "__new__")
    new = new.__func__ if isinstance(new, staticmethod) else new
    instance: Value
    if new is vars(tuple)["__new__"]:
        instance = new_tuple(tr, [ObjectValue(cls), *args], kwargs)
    elif isinstance(new, types.FunctionType):
        instance = dispatch.call(tr, function_value(new, None), [ObjectValue(cls), *args], kwargs)
    else:
        raise unsupported("unsupported_call", f"constructing {cls.__qualname__}")
    init = python_method(tr, instance, "__init__")
    if init is not None and isinstance(instance, TupleValue) and instance.cls is cls:
        dispatch.call(tr, init, args, kwargs)
    return instance


def new_tuple(tr: Tracer, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``tuple.__new__(cls, iterable=())``."""
    if kwargs or not args or len(args) > 2:
        raise unsupported("unsupported_call", "tuple.__new__ with these arguments")
    cls = (
        args[0].as_constant()
        if isinstance(args[0], ConstantValue)
        else getattr(args[0], "obj", None)
    )
    if not (isinstance(cls, type) and issubclass(cls, tuple)):
        raise unsupported("unsupported_call", f"tuple.__new__({args[0]})")
    items = dispatch.unpack_iterable(tr, args[1]) if len(args) == 2 else []
    return TupleValue(items, cls)


def descriptor(obj: Any) -> tuple[type, str] | None:
    """(owner, name) when ``obj`` is a method descriptor of a builtin container type."""
    try:
        return _DESCRIPTORS.get(obj)
    except TypeError:  # unhashable
        return None


_DESCRIPTORS: dict[Any, tuple[type, str]] = {
    member: (owner, name)
    for owner in reversed(_BASES)  # OrderedDict's own methods win over dict's
    for name, member in vars(owner).items()
    if isinstance(member, (types.MethodDescriptorType, types.WrapperDescriptorType))
}
