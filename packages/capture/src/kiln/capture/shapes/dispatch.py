"""Running aten ops on meta tensors with symbolic sizes.

Most meta kernels take ``SymInt`` sizes, but some C++ kernels (``expand``, ``mm``'s
composite callers) convert their size arguments to concrete integers and fail on a symbol.
For those the op runs as its Python decomposition (torch's reference implementations, whose
meta kernels are symbolic throughout), or, for a composite op, as what it decomposes into;
the ops inside run the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["run_symbolic", "SymbolicMetaMode"]

# the message of c10's SymIntArrayRef -> IntArrayRef conversion, and its SymInt twin
_CONCRETE_ONLY = ("expected to contain only concrete integers", "concrete int")


def run_symbolic(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)``, through its decomposition where its kernel needs concrete
    sizes. Decompositions run under ``SymbolicMetaMode``, so their own ops are routed too."""
    try:
        return func(*args, **kwargs)
    except RuntimeError as e:
        if not any(m in str(e) for m in _CONCRETE_ONLY):
            raise
        failure = e
    decomposition = decomposition_table.get(func)
    with SymbolicMetaMode():
        if decomposition is not None:
            return decomposition(*args, **kwargs)
        out = func.decompose(*args, **kwargs)
    if out is NotImplemented:
        raise failure
    return out


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


def has_symbolic_sizes(t: torch.Tensor) -> bool:
    """Whether any size or stride of ``t`` is a symbol."""
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))
