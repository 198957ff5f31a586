"""Code patterns of model libraries (transformers' modeling files) traced in one graph.

Each test writes the library's pattern as user code, captures it, and runs the captured
function against eager over several calls with changing inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture import capture, explain


def _captured(fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
    report = explain(fn)(*args)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    result = capture(
        fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
    )
    return result.function


def _scaled_size_sqrt(x: torch.Tensor, scale_factor: int) -> torch.Tensor:
    return torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * scale_factor)


def _traced_body(x: torch.Tensor) -> torch.Tensor:
    return x.relu() * 2


with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still used
    scaled_size_sqrt = torch.jit.script(_scaled_size_sqrt)
    traced_helper = torch.jit.trace(_traced_body, torch.randn(3))


class Attention(torch.nn.Module):
    """Calls scripted and traced helpers, as DeBERTa's attention does."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = torch.nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, dim=-1)
        scale = scaled_size_sqrt(q, 2)
        return traced_helper(q @ k.transpose(-1, -2) / scale.to(dtype=q.dtype))


def test_jit_scripted_and_traced_helpers_traced_as_python():
    m = Attention()
    run = _captured(m.forward, torch.randn(2, 4, 8))
    for n in (4, 4, 6):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(run(x), m(x))
