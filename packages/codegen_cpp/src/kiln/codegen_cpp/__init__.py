"""kiln.codegen_cpp: C++/OpenMP kernels for CPUs; see the package README for the API."""

from kiln.codegen_cpp.__about__ import __version__
from kiln.codegen_cpp.build import BuiltLibrary, Toolchain, build_libraries, toolchain
from kiln.codegen_cpp.errors import (
    CodegenCppError,
    CompilerNotFound,
    CppBuildError,
    KernelIndexError,
)
from kiln.codegen_cpp.kernel import KernelWriter
from kiln.codegen_cpp.scheduling import CppBackend, make_backend

__all__ = [
    "BuiltLibrary",
    "CodegenCppError",
    "CompilerNotFound",
    "CppBackend",
    "CppBuildError",
    "KernelIndexError",
    "KernelWriter",
    "Toolchain",
    "__version__",
    "build_libraries",
    "make_backend",
    "toolchain",
]
