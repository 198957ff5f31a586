"""autograd_aot's errors, rooted in :class:`kiln.capture.errors.KilnError`."""

from __future__ import annotations

from kiln.capture.errors import KilnError

__all__ = ["AotError", "UnsupportedMutation"]


class AotError(KilnError):
    """The ATen tracer, functionalization pass or partitioner cannot handle a graph."""


class UnsupportedMutation(AotError):
    """A mutation the functionalization pass cannot turn into functional ops."""
