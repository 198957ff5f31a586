"""kiln.codegen_triton: see the package README for its role and public API."""

from kiln.codegen_triton.__about__ import __version__
from kiln.codegen_triton.autotune import Config, candidate_configs
from kiln.codegen_triton.config import TritonOptions, options
from kiln.codegen_triton.cudagraphs import CudaGraphRunner, cudagraphify, unsafe_reason
from kiln.codegen_triton.errors import TritonCodegenError, TritonLaunchError, TritonUnavailable
from kiln.codegen_triton.kernel import KernelSource, TritonKernel
from kiln.codegen_triton.matmul import Epilogue, TritonMatmul, pick_matmul
from kiln.codegen_triton.runtime import TritonLauncher
from kiln.codegen_triton.scheduling import TritonBackend, make_backend

__all__ = [
    "Config",
    "CudaGraphRunner",
    "Epilogue",
    "KernelSource",
    "TritonBackend",
    "TritonCodegenError",
    "TritonKernel",
    "TritonLaunchError",
    "TritonLauncher",
    "TritonMatmul",
    "TritonOptions",
    "TritonUnavailable",
    "__version__",
    "candidate_configs",
    "cudagraphify",
    "make_backend",
    "options",
    "pick_matmul",
    "unsafe_reason",
]
