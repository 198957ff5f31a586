"""The decomposition table: torch's core ATen set plus Kiln's own entries.

The tracer applies the table recursively (a decomposition's own ops are traced
again) until only ops outside the table remain. Kiln adds decompositions where
its compiler prefers pointwise ops and reductions to a fused ATen kernel, and
one for the functional ``copy`` that functionalization emits, and seeded random
ops (``rng.py``) so a backward can recompute them, and forward-mode AD's data-less zero
tensors as plain zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch._decomp

from kiln.autograd_aot.rng import random_decompositions

__all__ = [
    "DecompositionTable",
    "default_decompositions",
    "describe_table",
    "for_training",
    "kiln_decompositions",
]

aten = torch.ops.aten

DecompositionTable = Mapping[Any, Callable[..., Any]]

# Fused kernels the core set keeps, which Kiln's loop compiler would rather see
# as pointwise ops and reductions (taken from torch's full table).
_KILN_FROM_TORCH = (
    aten._softmax.default,
    aten._log_softmax.default,
    aten.native_layer_norm.default,
    aten.native_dropout.default,
    aten.gelu.default,
    aten.hardtanh.default,
    aten.addmm.default,
    aten._native_batch_norm_legit_functional.default,
)


def _functional_copy(
    self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False
) -> torch.Tensor:
    """``copy(self, src)`` as a cast and a broadcast: what a functional ``copy_`` leaves."""
    out = src
    if src.dtype != self.dtype or src.device != self.device:
        out = aten._to_copy.default(src, dtype=self.dtype, device=self.device)
    if out.shape != self.shape:
        out = aten.expand.default(out, list(self.shape))
    return aten.clone.default(out) if out is src else out


def _masked_index_put(
    self: torch.Tensor,
    indices: list[torch.Tensor | None],
    values: torch.Tensor,
    accumulate: bool = False,
) -> Any:
    """``x[mask] = v`` with one value: a ``where``, with no data-dependent indices."""
    mask = indices[0] if len(indices) == 1 else None
    if accumulate or mask is None or mask.dtype not in (torch.bool, torch.uint8):
        return NotImplemented
    if values.numel() != 1:
        return NotImplemented
    mask = aten.view.default(mask.bool(), [*mask.shape] + [1] * (self.dim() - mask.dim()))
    value = aten.view.default(values.to(self.dtype), [])
    return aten.where.self(mask, value, self)


def _materialized_zeros(size: list[int], **options: Any) -> torch.Tensor:
    """``_efficientzerotensor``: forward-mode AD's (``jvp``, ``jacfwd``) zero tangent, a
    ZeroTensor that owns no data, as plain zeros, which compiled kernels can read."""
    return aten.zeros.default(size, **options)


def _batch_norm_no_training(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eval-mode batch norm through the functional op, writing no statistic.

    torch's entry calls ``_native_batch_norm_legit``, whose schema writes the running
    statistics: traced, every batch norm would return its (unchanged) statistics and copy
    them back into the buffers on each call. With symbolic sizes torch's Python dispatcher
    routes every eval-mode ``batch_norm`` here, so a convolutional net got two kernels and
    two copies per batch norm that its static graph does not have."""
    out = aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, False, momentum, eps
    )
    return out[0], out[1], out[2]


def kiln_decompositions() -> dict[Any, Callable[..., Any]]:
    """Kiln's additions to the core set."""
    table: dict[Any, Callable[..., Any]] = {
        aten.copy.default: _functional_copy,
        aten.index_put.default: _masked_index_put,
        aten._efficientzerotensor.default: _materialized_zeros,
        aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    }
    table.update(random_decompositions())
    full = torch._decomp.decomposition_table
    for op in _KILN_FROM_TORCH:
        if op in full:
            table[op] = full[op]
    return table


def _pairs_with_fused_backward(op: Any) -> bool:
    """Fused attention kernels: their decomposition's auxiliary outputs (logsumexp)
    do not match what the fused backward kernel expects, so training would be wrong."""
    return str(op).startswith("aten._scaled_dot_product_")


def default_decompositions() -> dict[Any, Callable[..., Any]]:
    """The core ATen decompositions plus :func:`kiln_decompositions`."""
    table = {
        op: fn
        for op, fn in torch._decomp.core_aten_decompositions().items()
        if not _pairs_with_fused_backward(op)
    }
    table.update(kiln_decompositions())
    return table


def for_training(table: DecompositionTable) -> DecompositionTable:
    """``table`` without entries that break a joint graph (fused attention forwards whose
    backward kernel stays fused), whoever built the table."""
    if not any(_pairs_with_fused_backward(op) for op in table):
        return table
    return {op: fn for op, fn in table.items() if not _pairs_with_fused_backward(op)}


def describe_table(table: DecompositionTable) -> str:
    """A one-line summary of a table, and its ops, for the ``aot`` log."""
    names = sorted(str(op) for op in table)
    return f"{len(names)} decompositions: {', '.join(names)}"
