"""The eager AOT backends the frontend registers: ATen graphs run with eager kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from kiln.autograd_aot.aot import aot_compile
from kiln.autograd_aot.decomp import default_decompositions

__all__ = ["aot_eager", "aot_eager_decomp_partition"]


def _run_eagerly(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
    return gm


def aot_eager(gm: torch.nn.Module, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """Trace, make functional and partition (saving every needed value); no decompositions."""
    return aot_compile(
        gm, example_inputs, fw_compiler=_run_eagerly, decompositions={}, partitioner="save_all"
    )


def aot_eager_decomp_partition(
    gm: torch.nn.Module, example_inputs: Sequence[Any]
) -> Callable[..., Any]:
    """Like :func:`aot_eager` with Kiln's decompositions and the min-cut partitioner."""
    return aot_compile(
        gm,
        example_inputs,
        fw_compiler=_run_eagerly,
        decompositions=default_decompositions(),
        partitioner="mincut",
    )


# Both compile a graph whose inputs have symbolic sizes once for every size its guards admit.
aot_eager.dynamic_shapes = True  # type: ignore[attr-defined]
aot_eager_decomp_partition.dynamic_shapes = True  # type: ignore[attr-defined]
