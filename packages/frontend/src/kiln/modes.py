"""Modes that say what they do: a request the backend cannot honour is said once.

``mode="max-autotune"`` tunes Triton kernels; the C++ backend has nothing to tune.
``mode="reduce-overhead"`` (and ``max-autotune``) record CUDA graphs, which only CUDA
tensors can be part of. A graph that gets neither runs as in the default mode, which is
right, but silent it misleads: the first graph of each ``kiln.compile`` call that cannot get
what was asked says so with one warning on ``kiln.frontend.modes``, visible at Python's default
logging level. (CUDA graphs skipped on CUDA for a reason are said by the code generator.)
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from kiln.config import CompileConfig

__all__ = ["say_unhonoured"]

log = logging.getLogger("kiln.frontend.modes")

_said: dict[int, set[str]] = {}  # per compile settings (by id, dropped with them): what was said

# option -> what it asks for, and why a graph with no CUDA tensor cannot have it
_NEEDS_CUDA = {
    "max_autotune": "autotuning, which only Triton kernels (CUDA) have: C++ kernels compile "
    "as in the default mode",
    "cudagraphs": "CUDA graphs, which only CUDA tensors can be recorded in: the graph runs "
    "without them",
}


def say_unhonoured(
    config: CompileConfig, name: str, gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> None:
    """Warn, once per ``config``, for each requested option a graph on ``gm``'s devices
    cannot have (``name``: the user's function)."""
    wanted = [
        key for key, value in config.backend_options().items() if value and key in _NEEDS_CUDA
    ]
    if not wanted or "cuda" in _devices(gm, example_inputs):
        return
    said = _said.get(id(config))
    if said is None:
        said = _said[id(config)] = set()
        weakref.finalize(config, _said.pop, id(config), None)
    for key in wanted:
        if key not in said:
            said.add(key)
            asked = (
                f"options={{{key!r}: True}}" if key in config.options else f"mode={config.mode!r}"
            )
            log.warning("kiln: %s: %s asks for %s", name, asked, _NEEDS_CUDA[key])


def _devices(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> set[str]:
    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return {v.device.type for v in [*values, *example_inputs] if isinstance(v, torch.Tensor)}
