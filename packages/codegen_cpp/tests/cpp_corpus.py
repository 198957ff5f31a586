"""Hand-built loopir kernel groups for the C++ backend's differential tests.

Each :class:`Case` is a :class:`KernelGroup` and a recipe for fresh random inputs;
tests run it through the C++ backend and through loopir's reference backend
(which defines what a kernel computes) and compare the outputs. The builders are
:mod:`kiln.loopir.testing`'s.
"""

from __future__ import annotations

from kiln.loopir.testing import (
    CPU,
    Case,
    group,
    inp,
    layout,
    outputs_for,
    pointwise,
    random_tensor,
    reduction,
    scatter,
    split_args,
)

__all__ = [
    "CPU",
    "Case",
    "group",
    "inp",
    "layout",
    "outputs_for",
    "pointwise",
    "random_tensor",
    "reduction",
    "scatter",
    "split_args",
]
