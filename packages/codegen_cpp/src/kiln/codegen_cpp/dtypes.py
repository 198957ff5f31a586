"""torch dtypes as C++ types: storage, scalar compute and vector compute.

bfloat16 and float16 are stored as 16 bits but every value a kernel computes
with is a ``float``; a ``to_dtype`` to them rounds the float (loopir never asks
for half math). ``bool`` vectors are ``kiln::Mask``.
"""

from __future__ import annotations

import torch

from kiln.codegen_cpp.errors import CodegenCppError

__all__ = [
    "HALF_TYPES",
    "VECTOR_DTYPES",
    "compute_ctype",
    "is_float",
    "storage_ctype",
    "vector_ctype",
]

_STORAGE: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.bfloat16: "kiln::bf16_t",
    torch.float16: "kiln::half_t",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
}

HALF_TYPES: frozenset[torch.dtype] = frozenset({torch.bfloat16, torch.float16})
VECTOR_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.float32, torch.float64, torch.int32, torch.int64, torch.int16, torch.int8}
    | {torch.uint8, torch.bool}
    | HALF_TYPES
)
"""Dtypes the vectorized variant handles; a kernel touching others runs scalar."""


def _lookup(dtype: torch.dtype) -> str:
    try:
        return _STORAGE[dtype]
    except KeyError:
        msg = f"the C++ backend does not support {dtype} yet; run this graph with another backend"
        raise CodegenCppError(msg) from None


def storage_ctype(dtype: torch.dtype) -> str:
    """The element type of a buffer of ``dtype``."""
    return _lookup(dtype)


def compute_ctype(dtype: torch.dtype) -> str:
    """The scalar C++ type a value of ``dtype`` is computed in."""
    return "float" if dtype in HALF_TYPES else _lookup(dtype)


def vector_ctype(dtype: torch.dtype) -> str:
    """The vector type of a value of ``dtype`` in the vectorized variant."""
    if dtype == torch.bool:
        return "kiln::Mask"
    return f"kiln::Vec<{compute_ctype(dtype)}>"


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point
