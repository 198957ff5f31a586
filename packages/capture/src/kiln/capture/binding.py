"""Binding call arguments to a code object's parameters, as CPython does for a call."""

from __future__ import annotations

import inspect
import types

from kiln.capture.breaks.reasons import unsupported
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import DictValue, TupleValue

__all__ = ["bind_arguments", "code_signature"]

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def code_signature(fn: types.FunctionType) -> inspect.Signature:
    """The parameters CPython binds a call of ``fn`` to: its code object's, with its own defaults.

    ``inspect.signature(fn)`` reports what ``fn`` advertises instead: the wrapped function's
    signature when ``functools.wraps`` set ``__wrapped__`` (a decorator's ``wrapper(self, *args,
    **kwargs)`` reads as the original ``forward(self, input_ids=None, ...)``), or a
    ``__signature__`` someone assigned. Frames, sources and guards are about the code that runs.
    """
    bare = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    bare.__kwdefaults__ = fn.__kwdefaults__
    return inspect.signature(bare)


def _type_error(code: types.CodeType, what: str) -> Exception:
    return unsupported("user_exception", f"TypeError: {code.co_name}() {what}")


def bind_arguments(
    code: types.CodeType,
    defaults: tuple[Value, ...],
    kwdefaults: dict[str, Value],
    args: list[Value],
    kwargs: dict[str, Value],
) -> dict[str, Value]:
    """The initial locals of a call of ``code`` with ``args`` and ``kwargs``."""
    npos = code.co_argcount
    nkw = code.co_kwonlyargcount
    names = code.co_varnames
    positional = names[:npos]
    kwonly = names[npos : npos + nkw]
    rest = npos + nkw
    varargs = names[rest] if code.co_flags & CO_VARARGS else None
    varkw = names[rest + (1 if varargs else 0)] if code.co_flags & CO_VARKEYWORDS else None

    bound: dict[str, Value] = dict(zip(positional, args, strict=False))
    extra = args[npos:]
    if extra and varargs is None:
        raise _type_error(code, f"takes {npos} positional arguments but {len(args)} were given")
    if varargs is not None:
        bound[varargs] = TupleValue(list(extra))
    spill: dict[str, Value] = {}
    keyword_ok = set(positional[code.co_posonlyargcount :]) | set(kwonly)
    for key, value in kwargs.items():
        if key in keyword_ok:
            if key in bound:
                raise _type_error(code, f"got multiple values for argument {key!r}")
            bound[key] = value
        elif varkw is not None:
            spill[key] = value
        else:
            raise _type_error(code, f"got an unexpected keyword argument {key!r}")
    first_default = npos - len(defaults)
    for i, name in enumerate(positional):
        if name not in bound:
            if i < first_default:
                raise _type_error(code, f"missing required argument {name!r}")
            bound[name] = defaults[i - first_default]
    for name in kwonly:
        if name not in bound:
            if name not in kwdefaults:
                raise _type_error(code, f"missing required keyword-only argument {name!r}")
            bound[name] = kwdefaults[name]
    if varkw is not None:
        bound[varkw] = DictValue({k: (ConstantValue(k), v) for k, v in spill.items()})
    return bound
