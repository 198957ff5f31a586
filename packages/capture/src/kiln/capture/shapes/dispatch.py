"""Running aten ops on meta tensors with symbolic sizes.

A C++ kernel that reads a tensor's sizes as plain integers either fails on a symbolic tensor
or, in recent torch, materializes them by guarding each size to its value: the op then runs,
but every size it touched is specialized. So an op with a symbolic argument runs as its
Python decomposition (torch's reference implementations, symbolic throughout) or, for a
composite op, as what it decomposes into, or as its Python meta kernel; only ops whose C++
kernels take symbolic sizes (factories, ``as_strided``) and ops with none of those run
directly. The ops inside a decomposition are routed the same way.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table, meta_table
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["run_symbolic", "SymbolicMetaMode", "has_symbolic_sizes"]

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


def has_symbolic_sizes(t: torch.Tensor) -> bool:
    """Whether any size or stride of ``t`` is a symbol."""
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _symbolic(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(
        isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool))
        or (isinstance(a, torch.Tensor) and has_symbolic_sizes(a))
        for a in pytree.tree_leaves((args, kwargs))
    )


def run_symbolic(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` without letting a C++ kernel specialize symbolic sizes."""
    if func in _SYMBOLIC_KERNELS or not _symbolic(args, kwargs):
        return func(*args, **kwargs)
    with SymbolicMetaMode():
        decomposition = decomposition_table.get(func)
        if decomposition is not None:
            out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        python_meta = meta_table.get(func)
        if python_meta is not None:
            return python_meta(*args, **kwargs)
    return func(*args, **kwargs)


class SymbolicMetaMode(TorchDispatchMode):
    """Every aten op inside runs through ``run_symbolic``."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return run_symbolic(func, args, kwargs or {})
