"""The decomposition table loopir wants applied before (or while) it lowers.

Built on autograd_aot's table (the core ATen decompositions and Kiln's own: seeded
random ops, the functional ``copy``, fused kernels Kiln prefers as their parts), plus
the composite ops loopir also prefers to see as their parts (the activation
backwards, group norm, upsampling...), minus every op loopir lowers directly.
A lowering may still decline one call (``Unlowerable``): ``declined_decomposition``
then gives torch's decomposition of that op, if it has one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table, get_decompositions

from kiln.autograd_aot import default_decompositions
from kiln.loopir.lowering import LOWERINGS

__all__ = ["decompositions", "declined_decomposition"]

aten = torch.ops.aten

# beyond autograd_aot's table, which already holds _softmax, _log_softmax, native_layer_norm,
# native_dropout, gelu and the functional batch norms
_EXTRA = [
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.native_layer_norm_backward,
    aten.native_batch_norm,
    aten._native_batch_norm_legit,
    aten.native_batch_norm_backward,
    aten.gelu_backward,
    aten.silu,
    aten.silu_backward,
    aten.sigmoid_backward,
    aten.tanh_backward,
    aten.threshold_backward,
    aten.hardsigmoid,
    aten.hardswish,
    aten.leaky_relu,
    aten.elu,
    aten.softplus,
    aten.mish,
    aten.logsumexp,
    aten.native_dropout_backward,
    aten.rsub,
    aten.addcmul,
    aten.addcdiv,
    aten.split,
    aten.split_with_sizes,
    aten.unbind,
    aten.narrow,
    aten.stack,
    aten.repeat,
    aten.nan_to_num,
    aten.embedding_dense_backward,
    aten.mse_loss,
    aten.nll_loss_forward,
    aten.nll_loss_backward,
    aten.select_backward,
    aten.slice_backward,
    aten.diagonal,
    aten.trace,
    aten.log_sigmoid_forward,
    aten.xlogy,
    aten.logit,
    aten.linalg_vector_norm,
    aten.std_mean,
    aten.var_mean,
    aten.clamp_min,
    aten.clamp_max,
    aten.sgn,
    aten.t,
    aten.expand_as,
    aten.matmul,
    aten.linear,
    aten.native_group_norm,
    aten.native_group_norm_backward,
    aten.upsample_nearest2d,
    aten.upsample_bilinear2d,
    # torch's bernoulli, over autograd_aot's seeded draw: its rand_like is lowered, where
    # the seeded draw would be an extern call
    aten.bernoulli,
]


def _float_statistics(op: Any, training_at: int | None) -> Callable[..., Any]:
    """torch's decomposition of a functional batch norm (``op``), with half-precision running
    statistics updated in float32 (argument ``training_at`` says whether it trains; None:
    always).

    torch's computes ``(1 - momentum) * running_mean`` in the statistics' own dtype, rounding
    it to bfloat16 before the sum; ATen's kernels round the updated statistic once. The
    running statistics are the last two results.
    """
    torch_decomposition = decomposition_table[op]

    def decomposition(
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor,
        running_var: torch.Tensor,
        *rest: Any,
    ) -> Any:
        training = True if training_at is None else rest[training_at]
        if not training or running_mean.dtype not in (torch.bfloat16, torch.float16):
            return torch_decomposition(input, weight, bias, running_mean, running_var, *rest)
        stats = running_mean.to(torch.float32), running_var.to(torch.float32)
        *out, new_mean, new_var = torch_decomposition(input, weight, bias, *stats, *rest)
        return (*out, new_mean.to(running_mean.dtype), new_var.to(running_var.dtype))

    return decomposition


_FLOAT_STATISTICS = {
    aten._native_batch_norm_legit_functional.default: 0,  # (training, momentum, eps)
    aten._batch_norm_with_update_functional.default: None,  # (momentum, eps): trains
}


def _contiguous_repeat(self: torch.Tensor, repeats: Any) -> torch.Tensor:
    """torch's ``repeat`` decomposition, laid out contiguously as ATen's kernel lays it out.

    The decomposition's result is a permuted view of an expanded copy, so a ``view`` of it
    (``x.repeat(1, 2, 1).view(-1, d)``, which eager allows) would fail while tracing.
    """
    out: torch.Tensor = decomposition_table[aten.repeat.default](self, repeats)
    return out.contiguous()


@functools.cache
def _table() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = default_decompositions()
    table.update(get_decompositions([op for op in _EXTRA if op is not None]))
    for op, training_at in _FLOAT_STATISTICS.items():
        table[op] = _float_statistics(op, training_at)
    table[aten.repeat.default] = _contiguous_repeat
    return {op: fn for op, fn in table.items() if op not in LOWERINGS}


def decompositions() -> dict[Any, Callable[..., Any]]:
    """A fresh copy of the table (callers may extend theirs)."""
    return dict(_table())


def declined_decomposition(op: Any) -> Callable[..., Any] | None:
    """torch's decomposition of ``op``, for when loopir's own lowering declines a call
    (pooling windows too big to unroll, boolean-mask indexing...)."""
    return decomposition_table.get(op)
