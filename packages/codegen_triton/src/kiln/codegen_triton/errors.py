"""kiln.codegen_triton's errors, rooted in :class:`kiln.capture.errors.KilnError`."""

from __future__ import annotations

from kiln.loopir.errors import BackendError

__all__ = ["TritonCodegenError", "TritonUnavailable", "TritonLaunchError"]


class TritonCodegenError(BackendError):
    """A kernel could not be written as Triton (an op or index form we do not print)."""


class TritonUnavailable(BackendError):
    """Triton or a CUDA device is missing; loopir falls back to another backend."""


class TritonLaunchError(BackendError):
    """A compiled kernel failed to compile or launch on the device."""
