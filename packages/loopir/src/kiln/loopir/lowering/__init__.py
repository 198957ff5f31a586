"""ATen → IR lowerings, one module per op family; importing this fills ``LOWERINGS``."""

from kiln.loopir.lowering import (  # noqa: F401  (registration by import)
    activations,
    creation,
    fallback,
    indexing,
    pointwise,
    pooling,
    prims,
    reductions,
    scatter_views,
    views,
)
from kiln.loopir.lowering.registry import LOWERINGS, lowered_ops, register_lowering

__all__ = ["LOWERINGS", "lowered_ops", "register_lowering"]
