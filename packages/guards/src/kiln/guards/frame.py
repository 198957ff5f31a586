"""Reading a source's value for one call of the guarded function, outside generated code.

Explanations (``failure_reason``) and build-time work (resolving globals and closure
cells once) use this; generated checks read the same values inline.
"""

from __future__ import annotations

import builtins
import inspect
import types
from typing import Any

from kiln.capture.binding import code_signature
from kiln.capture.source import (
    AttrSource,
    ClosureSource,
    DefaultSource,
    GlobalSource,
    ItemSource,
    LocalSource,
    Source,
    root_of,
)

__all__ = ["builtins_of", "default_of", "frame_free", "resolve"]


def builtins_of(fn: types.FunctionType) -> dict[str, Any]:
    """The builtins a global name of ``fn`` falls back to."""
    table = fn.__globals__.get("__builtins__", builtins)
    return table if isinstance(table, dict) else vars(table)


def default_of(fn: Any, name: str, kwonly: bool) -> Any:
    """The default of parameter ``name`` of ``fn``."""
    if kwonly:
        return fn.__kwdefaults__[name]
    sig = code_signature(fn) if isinstance(fn, types.FunctionType) else inspect.signature(fn)
    return sig.parameters[name].default


def frame_free(source: Source) -> bool:
    """Whether ``source`` can be read without a call's arguments (a global or a closure cell)."""
    return isinstance(root_of(source), (GlobalSource, ClosureSource))


def resolve(source: Source, f_locals: dict[str, Any], fn: types.FunctionType) -> Any:
    """The current value of ``source`` for a call of ``fn`` with arguments ``f_locals``."""
    if isinstance(source, LocalSource):
        return f_locals[source.name]
    if isinstance(source, GlobalSource):
        if source.name in fn.__globals__:
            return fn.__globals__[source.name]
        return builtins_of(fn)[source.name]
    if isinstance(source, ClosureSource):
        cell = (fn.__closure__ or ())[fn.__code__.co_freevars.index(source.name)]
        return cell.cell_contents
    if isinstance(source, AttrSource):
        return getattr(resolve(source.base, f_locals, fn), source.name)
    if isinstance(source, ItemSource):
        return resolve(source.base, f_locals, fn)[source.index]
    if isinstance(source, DefaultSource):
        owner = fn if source.fn is None else resolve(source.fn, f_locals, fn)
        return default_of(owner, source.name, source.kwonly)
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    return source.resolve(f_locals, fn.__globals__, cells)
