"""Load built libraries with ctypes and call their kernels with tensors.

Every kernel has the C signature ``void name(<pointers...>, <int64 sizes...>)``;
:class:`KernelFunction` turns tensors into data pointers and Python numbers into
``int64``/``double`` arguments, so the Python wrapper calls it like a function.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path

import torch

from kiln.codegen_cpp.cache import verified
from kiln.codegen_cpp.errors import CodegenCppError

__all__ = ["KernelFunction", "load_library", "opened_libraries"]

_ARG_TYPES: dict[str, type] = {
    "ptr": ctypes.c_void_p,
    "i64": ctypes.c_int64,
    "f64": ctypes.c_double,
}


_opened: list[Path] = []


def opened_libraries() -> list[Path]:
    """The libraries this process loaded, in order (what a saved cache file bundles)."""
    return list(_opened)


@functools.cache
def load_library(path: Path) -> ctypes.CDLL:
    """Open a shared library once per process (later calls reuse the handle).

    Only a file its cache sidecar vouches for is opened: ``dlopen`` maps the
    file, and a truncated one faults with SIGBUS (killing the process) when
    touched, which no exception handler can turn into a fallback.
    """
    if not verified(path):
        msg = f"the cached library {path} does not match its recorded size and hash"
        raise CodegenCppError(msg)
    library = ctypes.CDLL(str(path))
    _opened.append(path)
    return library


class KernelFunction:
    """A callable over one ``extern "C"`` function of a loaded library.

    ``signature`` gives each parameter's kind: ``"ptr"`` (a tensor, passed as its
    data pointer), ``"i64"`` or ``"f64"`` (a Python number).
    """

    def __init__(self, library: Path, name: str, signature: Sequence[str]) -> None:
        self.name = name
        self.library = library
        self.signature = tuple(signature)
        fn = getattr(load_library(library), name)
        fn.argtypes = [_ARG_TYPES[kind] for kind in self.signature]
        fn.restype = None
        self.c_function = fn
        """The ctypes function itself: pointers as ints (what callers on a hot path use)."""

    def __call__(self, *args: torch.Tensor | int | float) -> None:
        converted = [arg.data_ptr() if isinstance(arg, torch.Tensor) else arg for arg in args]
        self.c_function(*converted)

    def __repr__(self) -> str:
        return f"KernelFunction({self.name!r} in {self.library.name})"
