"""What one benchmark model is: how to build it at a size preset, its inputs and its loss.

Models are built offline from configs with random weights (nothing is downloaded), seeded, so
every process that builds the same entry gets the same weights and inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["PRESETS", "Built", "ModelSpec", "default_loss", "first_tensor"]

PRESETS = ("cpu", "gpu")


@dataclasses.dataclass
class Built:
    """A constructed model with example inputs (positional and keyword)."""

    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One entry of the suite.

    ``build(preset)`` returns the model on CPU in float32; the worker moves it and its floating
    inputs to the device and dtype. ``loss`` turns the model's output into a scalar for training.
    """

    name: str
    suite: str
    build: Callable[[str], Built]
    loss: Callable[[Any], torch.Tensor] | None = None

    def loss_of(self, out: Any) -> torch.Tensor:
        return (self.loss or default_loss)(out)


def first_tensor(out: Any) -> torch.Tensor:
    """The main tensor of a model output: HF ``ModelOutput``, tuple, dict or a tensor."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, Sequence):
        for item in out:
            if isinstance(item, torch.Tensor):
                return item
    msg = f"no tensor in model output of type {type(out).__name__}"
    raise TypeError(msg)


def default_loss(out: Any) -> torch.Tensor:
    """Mean square of the main output: every element gets a gradient, nothing saturates."""
    return first_tensor(out).float().square().mean()
