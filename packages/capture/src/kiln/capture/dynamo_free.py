"""Running torch's Python kernels without importing TorchDynamo.

Many of torch's Python meta kernels, decompositions and references (``torch._refs``) are
wrapped in torch's ``_disable_dynamo``. That wrapper imports TorchDynamo on its first
call, to build the disabled function it then keeps on the wrapped function as its
``__dynamo_disable`` attribute; so is the ``__torch_dispatch__`` of every
``TorchDispatchMode`` subclass, Kiln's fake-tensor and tracing modes included. Capture and
tracing call both on every op, so the first compile of a process imported all of
TorchDynamo: seconds, most of a warm start served by the whole-graph cache, for a module
none of whose code runs.

:func:`spare_dynamo_import` sets that attribute beforehand, on every such kernel of torch's
tables and every dispatch mode's ``__torch_dispatch__``, to a :class:`_DisabledOnceImported`. While TorchDynamo is not imported, Dynamo
cannot be tracing, so running the function with Dynamo disabled is running the function.
Once it is imported (by PyTorch's compiler or anyone else), the next call builds torch's own
disabled function and puts it in place of this object, so from then on the function is
exactly what torch would have cached.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["spare_dynamo_import"]

_ATTRIBUTE = "__dynamo_disable"


@functools.cache
def _wrapper_code() -> Any:
    return torch._compile._disable_dynamo(lambda: None).__code__


class _DisabledOnceImported:
    """``fn`` while TorchDynamo is not imported. Once it is, this object takes itself off
    ``fn`` and calls torch's own ``wrapper`` of ``fn``, which then builds and keeps its
    disabled function as it always does: Kiln never calls into TorchDynamo itself."""

    def __init__(self, fn: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
        self.fn = fn
        self.wrapper = wrapper

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return self.fn(*args, **kwargs)
        if getattr(self.fn, _ATTRIBUTE, None) is self:
            with contextlib.suppress(AttributeError):  # another thread took it off first
                delattr(self.fn, _ATTRIBUTE)
        return self.wrapper(*args, **kwargs)


def _spare(start: Any, code: Any, seen: set[int]) -> int:
    """Prepare every ``_disable_dynamo`` wrapper ``start`` reaches through ``__wrapped__``
    and the functions its closure holds (torch's decorators do not all keep ``__wrapped__``)."""
    prepared, todo = 0, [start]
    while todo:
        fn = todo.pop()
        if type(fn) is not types.FunctionType or id(fn) in seen:  # it has no subclasses
            continue
        seen.add(id(fn))
        if (closure := fn.__closure__ or ()) and fn.__code__ is code:
            inner = closure[code.co_freevars.index("fn")].cell_contents
            if getattr(inner, _ATTRIBUTE, None) is None:
                setattr(inner, _ATTRIBUTE, _DisabledOnceImported(inner, fn))
                prepared += 1
        todo.append(fn.__dict__.get("__wrapped__"))  # where a function's attributes live
        for cell in closure:  # try, not contextlib.suppress: that was most of the walk's time
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
    return prepared


def _kernels() -> Iterable[Any]:
    """torch's Python kernels that fake tensors and tracing run: its decomposition and meta
    tables, and its reference implementations."""
    from torch import _decomp, _prims, _refs
    from torch._refs import linalg, special
    from torch._refs.nn import functional

    for table in _decomp.global_decomposition_table.values():
        yield from table.values()
    for module in (_refs, functional, special, linalg, _prims):
        yield from (v for v in vars(module).values() if callable(v))


def _modes(cls: type) -> Iterable[Any]:
    """The ``__torch_dispatch__`` each subclass of ``cls`` defines, at any depth."""
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        if "__torch_dispatch__" in sub.__dict__:
            yield sub.__dict__["__torch_dispatch__"]
        yield from _modes(sub)


@functools.cache
def _tables(code: Any) -> int:
    seen: set[int] = set()
    return sum(_spare(kernel, code, seen) for kernel in _kernels())


def spare_dynamo_import() -> None:
    """Keep torch's kernels and the dispatch modes defined so far from importing
    TorchDynamo (see the module docstring). The tables are walked once per process
    (milliseconds), the modes on every call."""
    if "torch._dynamo" in sys.modules:
        return
    code, seen = _wrapper_code(), set[int]()
    _tables(code)
    for mode in _modes(TorchDispatchMode):
        _spare(mode, code, seen)
