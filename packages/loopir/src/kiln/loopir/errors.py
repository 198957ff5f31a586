"""loopir's error hierarchy, rooted in :class:`kiln.capture.errors.KilnError`."""

from __future__ import annotations

from kiln.capture.errors import KilnError

__all__ = [
    "LoopIRError",
    "LoweringError",
    "Unlowerable",
    "BackendError",
    "IRVerificationError",
    "StaticShapesOnly",
]


class LoopIRError(KilnError):
    """Something went wrong turning an ATen graph into kernels."""


class LoweringError(LoopIRError):
    """An ATen op could not be lowered (and no fallback applies)."""


class Unlowerable(LoweringError):
    """A lowering declines these arguments; the op falls back to an ATen call."""


class IRVerificationError(LoopIRError):
    """An IR object broke an invariant ``verify()`` checks (a loopir bug)."""


class BackendError(LoopIRError):
    """No code generator is available for a device, or one misbehaved."""


class StaticShapesOnly(LoopIRError, ValueError):
    """A graph with symbolic sizes uses something loopir compiles for static sizes only (a
    size it must know as a number, a size expression it cannot print, a size no input
    carries). Raised before any kernel of the graph runs, so the frontend can compile the
    graph once per set of sizes instead (``kiln.dynamic.per_size``). A ``ValueError`` too,
    as the size evaluation that raises it always was."""
