"""Code patterns of timm's models, model-free: each is one graph and equal to eager.

Each test writes the pattern as a model's forward does, runs it over several calls with fresh
inputs, and asserts the graph count, so a construct that breaks the graph shows here first.
"""

# ruff: noqa: UP006, UP035, UP045 - typing's generics are the pattern under test
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from kiln.capture import explain


def _one_graph(fn, *make_args, calls=3):  # type: ignore[no-untyped-def]
    for i in range(calls):
        torch.manual_seed(i)
        args = [make() for make in make_args]
        ex = explain(fn)(*args)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), str(ex)
        torch.testing.assert_close(ex.result, fn(*args))


def test_jit_annotate_with_typing_generics() -> None:
    # crossvit: ``torch.jit.annotate(List[torch.Tensor], [])`` builds the branch outputs
    def f(x: torch.Tensor) -> torch.Tensor:
        outs = torch.jit.annotate(List[torch.Tensor], [])
        for i in range(2):
            outs.append(x * i)
        d = torch.jit.annotate(Dict[str, torch.Tensor], {})
        d["a"] = x
        o = torch.jit.annotate(Optional[torch.Tensor], None)
        t = torch.jit.annotate(Tuple[int, ...], (1, 2))
        u = torch.jit.annotate(list[torch.Tensor], [x])
        return torch.cat(outs).sum() + d["a"] + (0 if o is None else 1) + t[1] + u[0]

    _one_graph(f, lambda: torch.randn(3))
