"""Code patterns of model libraries (transformers' modeling files) traced in one graph.

Each test writes the library's pattern as user code, captures it, and runs the captured
function against eager over several calls with changing inputs.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kiln.capture import GuardKind, capture, explain


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
    for n in (4, 4, 4):
        x = torch.randn(2, n, 8)
        torch.testing.assert_close(run(x), m(x))


class LayerState:
    """Per-layer state built in ``forward`` with ``dict.fromkeys``, as transformers' caches are."""

    def __init__(self, n: int) -> None:
        self.states = dict.fromkeys(range(n))
        self.ready = collections.OrderedDict.fromkeys(("conv", "ssm"), False)


def test_dict_fromkeys_in_forward():
    def forward(x: torch.Tensor, n: int) -> torch.Tensor:
        state = LayerState(n)
        for i in state.states:
            state.states[i] = x * i
        total = sum(v for v in state.states.values() if v is not None)
        return total + len(state.ready) + sum(state.ready.values())

    run = _captured(forward, torch.randn(3), 3)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(run(x, 3), forward(x, 3))


class Cache:
    def __init__(self, seen: int) -> None:
        self.seen = seen


def test_identity_of_a_frame_object_and_none():
    """``cache is not None`` is settled by the object's guarded type, not by its identity."""

    def forward(x: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        use_cache = cache is not None and cache.seen > 0
        return x * 2 if use_cache else x - 1

    for seen in (0, 1, None):
        cache = Cache(seen) if seen is not None else None
        report = explain(forward)(torch.randn(3), cache)
        assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
        assert not [g for g in report.guards[0] if g.kind is GuardKind.ID_MATCH]
        result = capture(
            forward,
            (torch.randn(3), cache),
            {},
            compile_graph=lambda gm, ex: gm.forward,
            wrap_callable=lambda f: f,
        )
        for _ in range(3):  # a new object in each call, as transformers makes its caches
            fresh = Cache(seen) if seen is not None else None
            x = torch.randn(3)
            torch.testing.assert_close(result.function(x, fresh), forward(x, fresh))


def test_python_scalar_types_as_dtypes():
    """``dtype=int`` and ``.to(float)``, as transformers' mask helpers write them."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        pad = torch.zeros(x.shape[0], device=x.device, dtype=int)
        flags = torch.ones_like(x, dtype=bool)
        return (x.to(float) + pad[:, None]).sum(-1) * flags.sum() + torch.zeros(
            1, dtype=complex
        ).real

    run = _captured(forward, torch.randn(2, 3))
    for _ in range(3):
        x = torch.randn(2, 3)
        actual, expected = run(x), forward(x)
        assert actual.dtype == expected.dtype == torch.float64
        torch.testing.assert_close(actual, expected)


def _selective_scan(a: torch.Tensor, b: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Mamba's scan on its compiled path: torch's associative_scan when compiling."""
    if torch.compiler.is_compiling():
        from torch._higher_order_ops.associative_scan import associative_scan

        def combine_fn(left, right):
            a_left, b_left = left
            a_right, b_right = right
            return a_left * a_right, a_right * b_left + b_right

        _, states = associative_scan(combine_fn, (a, b), dim=2, reverse=reverse)
        total = associative_scan(lambda x, y: x + y, a, dim=-1, combine_mode="generic")
        return states + total
    states, h = [], torch.zeros_like(b.select(2, 0))
    steps = range(a.shape[2] - 1, -1, -1) if reverse else range(a.shape[2])
    for i in steps:
        h = a.select(2, i) * h + b.select(2, i)
        states.append(h)
    if reverse:
        states.reverse()
    return torch.stack(states, 2) + a.cumsum(-1)


@pytest.mark.parametrize("reverse", [False, True])
def test_associative_scan_on_the_compiled_path(reverse):
    run = _captured(_selective_scan, torch.rand(2, 3, 5, 4), torch.randn(2, 3, 5, 4), reverse)
    for _ in range(3):
        a, b = torch.rand(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
        torch.testing.assert_close(run(a, b, reverse), _selective_scan(a, b, reverse))


def test_associative_scan_takes_rounds_logarithmic_in_its_length():
    """The scan combines every other element at once, so doubling the sequence adds a round
    of a few ops, where a step-by-step scan would add hundreds (and kernels inlining that
    chain would recompute it for every element)."""

    def ops(length: int) -> int:
        a, b = torch.rand(1, 2, length, 3), torch.randn(1, 2, length, 3)
        result = capture(
            _selective_scan,
            (a, b, False),
            {},
            compile_graph=lambda gm, ex: gm.forward,
            wrap_callable=lambda f: f,
        )
        (graph,) = result.graphs
        return sum(1 for n in graph.graph.nodes if n.op == "call_function")

    assert ops(128) - ops(64) < 60
