"""kiln.codegen_triton: see the package README for its role and public API."""

from kiln.codegen_triton.__about__ import __version__
from kiln.codegen_triton.config import TritonOptions, options
from kiln.codegen_triton.errors import TritonCodegenError, TritonLaunchError, TritonUnavailable
from kiln.codegen_triton.scheduling import TritonBackend, make_backend

__all__ = [
    "TritonBackend",
    "TritonCodegenError",
    "TritonLaunchError",
    "TritonOptions",
    "TritonUnavailable",
    "__version__",
    "make_backend",
    "options",
]
