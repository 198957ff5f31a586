"""What a zoo builder hands the runner: a model and the recipe for its random inputs.

Inputs are a recipe (name -> kind, shape, bound) rather than tensors so that every call can draw
fresh values of the same shapes: the runner compares compiled and eager over several calls with
changing inputs, and a shape change would only measure recompiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["Built", "InputSpec", "make_inputs"]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One keyword argument: ``ids`` (integers in ``[low, high)``) or ``float`` (normal)."""

    kind: str
    shape: tuple[int, ...]
    low: int = 0
    high: int = 0


@dataclasses.dataclass
class Built:
    """A zoo model ready to run: the module (eval mode, CPU), its inputs and what was chosen.

    ``train_inputs`` are passed in train mode only: the labels a forward requires when
    training (a text-to-speech model trains on given durations and spectrograms), which eval
    mode does not take so that both modes run the model as its users call it.
    """

    name: str
    model: torch.nn.Module
    inputs: dict[str, InputSpec]
    variant: str
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_inputs: dict[str, InputSpec] = dataclasses.field(default_factory=dict)

    def inputs_for(self, train: bool) -> dict[str, InputSpec]:
        """The input recipe of eval (``train`` False) or train mode."""
        return {**self.inputs, **self.train_inputs} if train else self.inputs


def make_inputs(inputs: dict[str, InputSpec], seed: int) -> dict[str, torch.Tensor]:
    """Fresh inputs from ``inputs``' recipe, the same for the same ``seed``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in inputs.items():
        if spec.kind == "ids":
            out[name] = torch.randint(spec.low, spec.high, spec.shape, generator=g)
        else:
            out[name] = torch.randn(spec.shape, generator=g)
    return out
