"""Small hand-written models that each stress one thing a compiler must get right.

Fusion (pointwise chain, softmax + layer norm), matmul-heavy blocks (MLP, attention), Python
control flow unrolled over time steps, and a model with a deliberate graph break (a numpy call)
plus a data-dependent branch. ``debug_*`` entries fail on purpose and are never selected by
default; tests use them to check that a failing model is recorded and the run goes on.
"""

from __future__ import annotations

import functools
import math
import os
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.models.spec import Built, ModelSpec

__all__ = ["specs", "debug_specs"]

# (rows, width) per preset for the row-wise models.
_ROWS = {"cpu": (256, 256), "gpu": (8192, 1024)}


class MLPBlock(nn.Module):
    """A transformer MLP: LayerNorm, Linear, GELU, Linear, residual, LayerNorm."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(F.gelu(self.up(self.norm1(x))))
        return self.norm2(x + h)


class PointwiseChain(nn.Module):
    """Ten elementwise ops in a row: one fused kernel instead of ten memory round trips."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x) * self.scale + 1.0
        y = torch.sigmoid(y) * torch.cos(x)
        y = torch.tanh(y + x * 0.5)
        return torch.exp(-y.abs()) + torch.relu(y)


class SoftmaxLayerNorm(nn.Module):
    """Row reductions back to back: scaled softmax, then layer norm with a residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(self.proj(x) / math.sqrt(x.shape[-1]), dim=-1)
        return self.norm(x + p * x.shape[-1])


class AttentionBlock(nn.Module):
    """Multi-head self-attention written out with matmuls, softmax and a residual LayerNorm."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mixed = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        return self.norm(x + self.out(mixed))


class RNNLoop(nn.Module):
    """An Elman RNN stepped in Python: the loop and the every-other-step branch get unrolled."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.rec = nn.Linear(width, width, bias=False)
        self.skip_every = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros_like(x[:, 0])
        outs = []
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
            if t % self.skip_every == 0:
                h = h + x[:, t]
            outs.append(h)
        return torch.stack(outs, dim=1)


class GraphBreakModel(nn.Module):
    """A numpy call in the middle (a graph break) and a branch on a tensor's value."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.first = nn.Linear(width, width)
        self.second = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        scale = float(np.tanh(h.detach().float().cpu().numpy().mean())) + 1.0
        h = h * scale if h.mean() > 0.5 else h - scale  # a branch on a tensor's value
        return self.second(h)


def _rows(make: type[nn.Module], preset: str) -> Built:
    rows, width = _ROWS[preset]
    torch.manual_seed(0)
    return Built(make(width), (torch.randn(rows, width),))


def _attention(preset: str) -> Built:
    batch, seq, width, heads = (4, 128, 256, 4) if preset == "cpu" else (32, 1024, 1024, 16)
    torch.manual_seed(0)
    return Built(AttentionBlock(width, heads), (torch.randn(batch, seq, width),))


def _rnn(preset: str) -> Built:
    batch, steps, width = (16, 16, 128) if preset == "cpu" else (256, 32, 1024)
    torch.manual_seed(0)
    return Built(RNNLoop(width), (torch.randn(batch, steps, width),))


def specs() -> list[ModelSpec]:
    return [
        ModelSpec("mlp_layernorm_gelu", "handwritten", functools.partial(_rows, MLPBlock)),
        ModelSpec("pointwise_chain", "handwritten", functools.partial(_rows, PointwiseChain)),
        ModelSpec("softmax_layernorm", "handwritten", functools.partial(_rows, SoftmaxLayerNorm)),
        ModelSpec("attention_block", "handwritten", _attention),
        ModelSpec("rnn_loop", "handwritten", _rnn),
        ModelSpec("graph_break_numpy", "handwritten", functools.partial(_rows, GraphBreakModel)),
    ]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2.0


def _tiny(preset: str) -> Built:
    torch.manual_seed(0)
    return Built(_Tiny(), (torch.randn(4, 8),))


def _raises(preset: str) -> Built:
    msg = "debug_fail: this model fails to build on purpose"
    raise RuntimeError(msg)


def _crashes(preset: str) -> Built:
    os._exit(3)


def _hangs(preset: str) -> Built:
    time.sleep(3600)
    return _tiny(preset)


def debug_specs() -> list[ModelSpec]:
    """Models for testing the harness itself: a tiny one, and ones that fail, crash or hang."""
    return [
        ModelSpec("debug_tiny", "debug", _tiny),
        ModelSpec("debug_fail", "debug", _raises),
        ModelSpec("debug_crash", "debug", _crashes),
        ModelSpec("debug_hang", "debug", _hangs),
    ]
