"""Which dict dataclasses capture traces with its knowledge of transformers' ``ModelOutput``.

A ``ModelOutput`` is an ``OrderedDict`` dataclass whose fields that are not None are also its
items: its ``__post_init__`` stores them, its ``__setattr__`` and ``__setitem__`` keep item and
attribute together. Capture keeps such an object as its items alone (a :class:`DictValue` of
the class) instead of tracing that code. The knowledge holds only where the class really
builds and stores as ``ModelOutput`` does: a lookalike with a ``__post_init__`` or stores of its
own (or one not made from ``ModelOutput`` at all) is traced through its own Python, like any
dict subclass. Methods that read (``to_tuple``, ``__getitem__``) are the class's own wherever
it defines them, ``ModelOutput`` or not.

``ModelOutput`` is named by its module and name: capture works without transformers installed.
"""

from __future__ import annotations

import collections
import dataclasses
import types
from typing import Any

__all__ = ["is_model_output", "is_model_output_base", "written_by_dataclass"]

_MODEL_OUTPUT = ("transformers.utils.generic", "ModelOutput")
# what makes the fields that are not None the items: construction and stores
_BUILDS = (
    "__new__",
    "__init__",
    "__post_init__",
    "__setattr__",
    "__setitem__",
    "__delattr__",
    "__getattribute__",
    "__getattr__",
)


def is_model_output_base(klass: type) -> bool:
    """Whether ``klass`` is transformers' ``ModelOutput`` itself."""
    return (getattr(klass, "__module__", None), getattr(klass, "__qualname__", None)) == (
        _MODEL_OUTPUT
    )


def is_model_output(cls: Any) -> bool:
    """Whether instances of ``cls`` are built and stored into as ``ModelOutput``'s: an
    ``OrderedDict`` dataclass made from ``ModelOutput`` whose construction and stores are
    ``ModelOutput``'s, the builtin types', or the ``__init__`` that ``@dataclass`` wrote."""
    if not (
        isinstance(cls, type)
        and issubclass(cls, collections.OrderedDict)
        and dataclasses.is_dataclass(cls)
        and any(is_model_output_base(k) for k in cls.__mro__)
    ):
        return False
    for name in _BUILDS:
        owner = next((k for k in cls.__mro__ if name in vars(k)), object)
        if owner in (object, dict, collections.OrderedDict) or is_model_output_base(owner):
            continue
        if not (name == "__init__" and written_by_dataclass(vars(owner)[name])):
            return False
    return True


def written_by_dataclass(fn: Any) -> bool:
    """Whether ``fn`` is a method ``@dataclass`` generated (its text is compiled from a string)."""
    return isinstance(fn, types.FunctionType) and fn.__code__.co_filename == "<string>"
