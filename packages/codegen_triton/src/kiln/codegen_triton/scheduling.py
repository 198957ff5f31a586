"""The backend object loopir calls for CUDA kernels (``kiln.backends`` entry point ``cuda``).

``codegen_kernel`` writes the kernel (``kernel.py``), stores it in the on-disk
cache, starts compiling it in a worker process when a GPU is present, and
returns a :class:`~kiln.codegen_triton.runtime.TritonLauncher` as the callable
the wrapper launches. ``fusion_veto`` refuses what the kernel writer cannot
express.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from kiln.capture import artifacts, counters
from kiln.codegen_triton.autotune import candidate_configs
from kiln.codegen_triton.compile_pool import compile_pool
from kiln.codegen_triton.config import TritonOptions, options
from kiln.codegen_triton.errors import TritonUnavailable
from kiln.codegen_triton.kernel import KernelSource, TritonKernel
from kiln.codegen_triton.mathlib import INTERPRET
from kiln.codegen_triton.module_cache import write_module
from kiln.codegen_triton.ops import _TL_TYPES
from kiln.codegen_triton.runtime import TritonLauncher
from kiln.codegen_triton.symbolic_launch import SymbolicLauncher
from kiln.loopir.backend import BackendTraits
from kiln.loopir.kernel import KernelCode, KernelGroup

__all__ = ["TritonBackend", "make_backend"]

log = logging.getLogger(__name__)
output_log = logging.getLogger("kiln.codegen_triton.output_code")


_OUTER_PERSISTENT_LIMIT = 256
"""The longest row an outer reduction (``KernelSource.outer``) folds in one block: with
at most 4096 elements a block, longer rows leave fewer than 16 contiguous columns."""


class TritonBackend:
    """loopir's :class:`~kiln.loopir.backend.Backend` for Triton."""

    name = "triton"

    def __init__(self, opts: TritonOptions | None = None) -> None:
        self.options = opts if opts is not None else options
        self.traits = BackendTraits(
            # reduction rows (one program each) to run at once: 8 per multiprocessor
            reduction_split_rows=_rows_at_once(),
            # cuDNN runs depthwise convolutions in NHWC only; ATen's NCHW kernels are slow
            depthwise_nhwc=True,
            # cuBLAS's tensor-core GEMMs want every matrix's rows in whole 16-byte units
            matmul_align_bytes=16,
            # ATen adds a cuDNN convolution's bias with a kernel launch of its own
            convolution_bias_pointwise=True,
            # cuBLASLt's product with a bias epilogue picks slower kernels than cuBLAS's
            matmul_bias_pointwise=True,
            # ATen copies an NCHW weight channels-last for cuDNN on every call, at several
            # times the host time of a launch of ours
            convolution_weight_nhwc=True,
        )

    def with_options(self, opts: Mapping[str, Any]) -> TritonBackend:
        """This backend for one graph compiled with ``kiln.compile(options=...)``."""
        wanted = opts.get("max_autotune", self.options.max_autotune)
        if wanted == self.options.max_autotune:
            return self
        return TritonBackend(dataclasses.replace(self.options, max_autotune=wanted))

    def finalize(self) -> None:
        """Nothing to do: kernels compile ahead in the pool or on their first call."""

    def fusion_veto(self, group: KernelGroup) -> str | None:
        for name, layout in group.buffers.items():
            if layout.dtype not in _TL_TYPES:
                return f"buffer {name} has dtype {layout.dtype}, which Triton kernels do not load"
        return None

    def generate(self, group: KernelGroup) -> tuple[TritonKernel, KernelSource, str]:
        """The kernel writer after generation, its kernel, and the full module text."""
        writer = TritonKernel(group, persistent_limit=self.options.persistent_reduction_limit)
        ks = writer.generate()
        if ks.outer and ks.persistent and ks.rnumel > _OUTER_PERSISTENT_LIMIT:
            # a whole row per block leaves room for a few columns only: loop instead
            writer = TritonKernel(group, persistent_limit=_OUTER_PERSISTENT_LIMIT)
            ks = writer.generate()
        return writer, ks, ks.module_text

    def codegen_kernel(self, group: KernelGroup) -> KernelCode:
        writer, ks, text = self.generate(group)
        output_log.info("triton kernel %s:\n%s", group.name, text)
        artifacts.dump(f"{group.name}.py", text)
        path = write_module(self.options.cache_dir, text, group.name)
        configs = candidate_configs(ks, max_autotune=self.options.max_autotune)
        written = [
            n for n in group.outputs if n not in group.internal or n in writer.loaded_from_memory
        ]
        cache = self.options.cache_dir
        launcher = (
            TritonLauncher(ks, path, group.args, written, configs, cache)
            if ks.symbolic is None
            else SymbolicLauncher(
                ks, path, group.args, written, configs, cache,
                max_autotune=self.options.max_autotune,
            )
        )  # fmt: skip
        if self._compile_ahead():
            # started by the first kernel, not the backend: a process whose programs all come
            # from the whole-graph cache starts no workers
            compile_pool(self.options.compile_workers).start()
            dtypes = [group.buffers[n].dtype for n in dict.fromkeys(group.args)]
            launcher.start_parallel_compile(dtypes, self.options.compile_workers)
        counters.bump("codegen_triton", "kernels")
        size_args = () if ks.symbolic is None else ks.symbolic.args
        return KernelCode(group.name, text, launcher, "triton", size_args)

    def _compile_ahead(self) -> bool:
        return self.options.parallel_compile and not INTERPRET and torch.cuda.is_available()


def _rows_at_once() -> int:
    if INTERPRET or not torch.cuda.is_available():
        return 1024
    return 8 * torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def make_backend(device_type: str = "cuda") -> TritonBackend:
    """Entry point: the backend, or :class:`TritonUnavailable` when it cannot run here."""
    if not INTERPRET and not torch.cuda.is_available():
        msg = "Triton kernels need a CUDA device (or TRITON_INTERPRET=1 for the interpreter)"
        raise TritonUnavailable(msg)
    if device_type != "cuda" and not (INTERPRET and device_type == "cpu"):
        msg = f"the Triton backend generates code for CUDA devices, not {device_type!r}"
        raise TritonUnavailable(msg)
    return TritonBackend()
