"""Helpers shared by the freezing tests: a forward compiler that keeps the graphs it gets, and
batch norms with statistics far from their initial ones (so a fold that drops one shows)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn


class Recorder:
    """A forward compiler that runs the ATen graph as is and keeps it."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Any) -> fx.GraphModule:
        self.graphs.append(gm)
        return gm


def batch_norm(c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn
