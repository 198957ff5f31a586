"""The ``libdevice`` namespace generated kernels call, real or interpreted.

On a GPU it is Triton's ``triton.language.extra.libdevice`` (present in Triton
3.6 and 3.8 alike; ``tl.extra.cuda.libdevice`` moved between releases, so we
never spell the backend-specific path). Under ``TRITON_INTERPRET=1`` Triton
cannot run extern calls, so the same names are answered by a shim that applies
the matching torch function to the interpreter's numpy data: tests on a
machine without a GPU run the exact kernel source a GPU would compile.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

__all__ = ["INTERPRET", "LIBDEVICE_UNARY", "LIBDEVICE_BINARY", "libdevice"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

LIBDEVICE_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "expm1": torch.expm1,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "tan": torch.tan,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "tanh": torch.tanh,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "erfc": torch.erfc,
    "erfinv": torch.special.erfinv,
    "lgamma": torch.lgamma,
    "trunc": torch.trunc,
    "rint": torch.round,
    "signbit": lambda t: torch.signbit(t).to(torch.int32),
}
"""Ops Triton's core lacks, by libdevice name, with the torch function the shim uses."""

LIBDEVICE_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "atan2": torch.atan2,
    "hypot": torch.hypot,
    "copysign": torch.copysign,
    "nextafter": torch.nextafter,
    "pow": torch.pow,
    "fmod": torch.fmod,
}


class _InterpretedLibdevice:
    """libdevice's names over the interpreter's tensors (numpy arrays in handles)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = LIBDEVICE_UNARY.get(name) or LIBDEVICE_BINARY.get(name)
        if fn is None:
            raise AttributeError(name)
        return lambda *args: _apply(fn, name, args)


def _apply(fn: Callable[..., torch.Tensor], name: str, args: tuple[Any, ...]) -> Any:
    first = args[0]
    datas = [torch.from_numpy(np.ascontiguousarray(a.handle.data)) for a in args]
    datas = [d.broadcast_to(torch.broadcast_shapes(*(x.shape for x in datas))) for d in datas]
    out = fn(*datas)
    shape = list(out.shape)
    if name == "signbit":
        scalar, out = tl.int32, out.to(torch.int32)
    else:
        scalar, out = first.dtype.scalar, out.to(datas[0].dtype)
    ty = tl.block_type(scalar, shape) if shape else scalar
    return tl.tensor(TensorHandle(out.numpy(), scalar), ty)


libdevice: Any = (
    _InterpretedLibdevice()
    if INTERPRET
    else importlib.import_module("triton.language.extra.libdevice")
)
