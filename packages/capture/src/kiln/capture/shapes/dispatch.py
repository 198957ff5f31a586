"""Running aten ops on meta tensors with symbolic sizes.

A C++ kernel that reads a tensor's sizes as plain integers either fails on a symbolic tensor
or, in recent torch, materializes them by guarding each size to its value: the op then runs,
but every size it touched is specialized. So an op with a symbolic argument runs as its
Python meta kernel (written to lay results out as eager's kernel does), else its Python
decomposition (torch's reference implementations, symbolic throughout; a decomposition may
lay its result out otherwise, ``repeat``'s is not contiguous) or, for a composite op, as
what it decomposes into; only ops whose C++
kernels take symbolic sizes (factories, ``as_strided``) and ops with none of those run
directly. The ops inside a decomposition are routed the same way.

A composite op (``matmul``, ``scaled_dot_product_attention``) is decomposed before a
dispatch mode sees it, by its C++ kernel, which may read sizes as plain integers (torch 2.11's
``matmul`` calls ``numel()``; its ``sdpa`` math kernel asks for ``sizes()``). So the mode
also switches on torch's Python dispatcher: the Python kernels torch registers for composite
ops (``matmul``) and for meta (``view``) then run instead of C++ ones, on every supported
torch, and a C++ composite kernel calls back into them.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import torch
from torch._decomp import decomposition_table, meta_table
from torch._dispatch.python import enable_python_dispatcher
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.capture import op_args
from kiln.capture.shapes import memo

__all__ = [
    "UNBACKED_KERNELS",
    "SymbolicMetaMode",
    "composites_in_python",
    "has_symbolic_sizes",
    "run_symbolic",
]

_aten = torch.ops.aten

# C++ kernels that take symbolic sizes as they are
_SYMBOLIC_KERNELS = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.as_strided.default,
        _aten.as_strided_.default,
        _aten.zeros.default,
        _aten.detach.default,
        _aten.view_as_real.default,
        _aten.view_as_complex.default,
    }
)


# Metadata queries a C++ kernel may send through the dispatcher (torch 2.11's math attention
# kernel calls ``aten.size.default``, which has no kernel to decompose into): each is answered
# from the tensor's own symbolic sizes, strides and offset.
_METADATA_QUERIES: dict[Any, Any] = {
    _aten.size.default: lambda t: list(t.shape),
    _aten.size.int: lambda t, d: t.shape[d],
    _aten.sym_size.default: lambda t: list(t.shape),
    _aten.sym_size.int: lambda t, d: t.shape[d],
    _aten.stride.default: lambda t: list(t.stride()),
    _aten.stride.int: lambda t, d: t.stride(d),
    _aten.sym_stride.default: lambda t: list(t.stride()),
    _aten.sym_stride.int: lambda t, d: t.stride(d),
    _aten.numel.default: lambda t: t.numel(),
    _aten.sym_numel.default: lambda t: t.numel(),
    _aten.storage_offset.default: lambda t: t.storage_offset(),
    _aten.sym_storage_offset.default: lambda t: t.storage_offset(),
}


#: Kernels for ops whose torch kernels decide on a data-dependent argument (``x[:n]`` for an
#: ``n`` from ``item()``), which ``kiln.capture.shapes.unbacked`` registers; NotImplemented
#: from one falls back to torch's.
UNBACKED_KERNELS: dict[Any, Any] = {}


def _has_unbacked(args: tuple[Any, ...]) -> bool:
    return any(
        isinstance(a, torch.SymInt) and getattr(a.node, "hint", 0) is None
        for a in op_args.leaves(args)
    )


def has_symbolic_sizes(t: torch.Tensor) -> bool:
    """Whether any size or stride of ``t`` is a symbol."""
    if not t._has_symbolic_sizes_strides:  # the tensor's own flag: every size a plain int
        return False
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _symbolic(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(
        isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool))
        or (isinstance(a, torch.Tensor) and has_symbolic_sizes(a))
        for a in op_args.leaves((args, kwargs))
    )


def composites_in_python(args: Any, kwargs: dict[str, Any]) -> Any:
    """A context for calling a torch function on fakes at the torch level: with symbolic sizes
    among the arguments, torch's Python dispatcher is on, so a C++ composite kernel that reads
    sizes as integers (torch 2.11's ``matmul`` inside CUDA attention) calls torch's Python
    kernel instead of specializing every size it reads."""
    if _symbolic(tuple(args), kwargs):
        return enable_python_dispatcher()
    return contextlib.nullcontext()


def run_symbolic(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` without letting a C++ kernel specialize symbolic sizes; a
    repeat of an earlier run on the same metadata is answered by the memo (most meta kernels
    are Python, even for static sizes: a layer norm's costs milliseconds)."""
    if func in _SYMBOLIC_KERNELS:
        return func(*args, **kwargs)
    if not _symbolic(args, kwargs):
        out, token = memo.recall(func, args, kwargs)
        if out is None:
            out = func(*args, **kwargs)
            memo.remember(token, args, kwargs, out)
        return out
    query = _METADATA_QUERIES.get(func)
    if query is not None:
        return query(*args, **kwargs)
    if func in UNBACKED_KERNELS and _has_unbacked((args, kwargs)):
        out = UNBACKED_KERNELS[func](*args, **kwargs)
        if out is not NotImplemented:
            return out
    out, token = memo.recall(func, args, kwargs)
    if out is not None:
        return out
    out = _run_python(func, args, kwargs)
    memo.remember(token, args, kwargs, out)
    return out


def _run_python(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` as its Python meta kernel, decomposition or composite, else its kernel."""
    with SymbolicMetaMode():
        # a Python meta kernel first: it gives the strides eager's kernel gives, where a
        # decomposition may lay its result out otherwise (``repeat``'s is not contiguous)
        python_meta = meta_table.get(func)
        if python_meta is not None:
            return python_meta(*args, **kwargs)
        decomposition = decomposition_table.get(func)
        if decomposition is not None:
            out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    return func(*args, **kwargs)


class SymbolicMetaMode(TorchDispatchMode):
    """Every aten op inside runs through ``run_symbolic``, with the Python dispatcher on so a
    composite op's Python decomposition runs in place of its C++ one."""

    def __enter__(self) -> SymbolicMetaMode:
        dispatcher = enable_python_dispatcher()
        dispatcher.__enter__()
        self._dispatchers = [*getattr(self, "_dispatchers", []), dispatcher]
        try:
            super().__enter__()
        except BaseException:
            self._dispatchers.pop().__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            self._dispatchers.pop().__exit__(exc_type, exc, tb)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return run_symbolic(func, args, kwargs or {})
