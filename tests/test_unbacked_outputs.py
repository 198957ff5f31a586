"""Numbers computed from tensor data that leave a graph, under ``capture_scalar_outputs`` /
``capture_dynamic_output_shape_ops``: returned by the frame, or live across a graph break.

Such a number (``t.item()``, ``int(t)``, ``t.tolist()``, ``nonzero``'s row count) is an
unbacked symbol: no source computes it from the frame's arguments, so the graph returns it
as an output (the Python number at run time). Each program compiles without breaking at the
``.item()``, equals eager over calls with different values, and never recompiles: a
continuation takes the number (or a tensor whose size came from data) as a symbolic input
from its first capture.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import kiln
from kiln.capture import counters

ON = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}
BACKENDS = ["aot_eager", "kiln"]
CALLS = 5


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no backend failure falling back to eager
        yield
    kiln.reset()


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    else:
        assert a == b


def _check(
    fn: Callable[..., Any], calls: list[tuple[Any, ...]], backend: str, breaks: int = 0
) -> None:
    """``fn`` compiled equals eager on every call; one graph (two around ``breaks``), the
    intentional break only, no recompile, no eager fallback."""
    compiled = kiln.compile(fn, backend=backend, options=ON)
    for args in calls:
        _same(compiled(*args), fn(*args))
    snap = counters.snapshot()
    want = {"unsupported_call": breaks} if breaks else {}
    assert snap.get("graph_breaks", {}) == want, snap
    assert snap["stats"]["graphs_compiled"] == 1 + breaks, snap
    assert snap["stats"].get("eager_fallbacks", 0) == 0, snap
    assert kiln.stats().recompiles == 0, snap


def _vectors(n: int = 8) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(n, generator=g),) for _ in range(CALLS)]


def returns_float(x: torch.Tensor) -> Any:
    n = x.sum().item()
    return x * 2, n, n * 3 + 1


def returns_int(x: torch.Tensor, t: torch.Tensor) -> Any:
    n = int(t)
    positive = (x > 0).sum().item()
    return x[:n] + 1, n, positive, n // 2 + positive, float(n)


def returns_bool(x: torch.Tensor) -> Any:
    return x.sum(), (x.sum() > 0).item()


def returns_tolist(x: torch.Tensor) -> Any:
    values = x[:3].tolist()
    return x.mean(), values, (x > 0).int().tolist()


def returns_nonzero_count(x: torch.Tensor) -> Any:
    rows = torch.nonzero(x > 0)
    return rows * 2, rows.shape[0], x[x > 0].numel()


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_item_float(backend: str) -> None:
    _check(returns_float, _vectors(), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_item_int(backend: str) -> None:
    calls = [(x, torch.tensor(n)) for (x,), n in zip(_vectors(), (5, 2, 7, 3, 6), strict=True)]
    _check(returns_int, calls, backend)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> Any:
    correct = (logits.argmax(-1) == labels).sum().item()
    loss = logits.logsumexp(-1).mean().item()
    return correct / labels.shape[0], correct, loss**0.5


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_ratio(backend: str) -> None:
    g = torch.Generator().manual_seed(3)
    calls = [
        (torch.randn(8, 3, generator=g), torch.randint(0, 3, (8,), generator=g))
        for _ in range(CALLS)
    ]
    _check(accuracy, calls, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_item_bool(backend: str) -> None:
    _check(returns_bool, _vectors(), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_tolist(backend: str) -> None:
    _check(returns_tolist, _vectors(), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_nonzero_count(backend: str) -> None:
    _check(returns_nonzero_count, _vectors(), backend)


def size_across_break(x: torch.Tensor) -> torch.Tensor:
    n = (x > 0).sum().item()
    y = x[:n] * 2
    os.getpid()  # breaks the graph: n and y (its size from data) go to the continuation
    return y + n, x[:n].sum() * n, torch.ones(n) * 3


def float_across_break(x: torch.Tensor) -> Any:
    scale = x.abs().max().item()
    values = x[:2].tolist()
    os.getpid()
    return x / scale + values[0] * values[1], scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_int_live_across_break_as_size(backend: str) -> None:
    # counts of at least 2 at the first call: 0 and 1 are specialized, as sizes are
    calls = [(x,) for x in (torch.tensor(v, dtype=torch.float) for v in _signs())]
    _check(size_across_break, calls, backend, breaks=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_and_tolist_live_across_break(backend: str) -> None:
    _check(float_across_break, _vectors(), backend, breaks=1)


def _signs() -> list[list[int]]:
    return [
        [1, -1, 2, 3, -4, 5],
        [1, 2, 3, 4, -1, -2],
        [-1, -1, 1, 1, 1, -1],
        [5, 4, 3, 2, 1, 7],
        [-3, 2, 2, -1, -1, -1],
    ]


def loss_and_value(x: torch.Tensor, w: torch.Tensor) -> Any:
    loss = ((x * w) ** 2).sum()
    return loss, loss.item(), (w > 0).sum().item()


def loss_across_break(x: torch.Tensor, w: torch.Tensor) -> Any:
    scale = (x * w).abs().max().item()
    os.getpid()
    return (x * w / scale).sum(), scale


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [loss_and_value, loss_across_break])
def test_training(backend: str, fn: Callable[..., Any]) -> None:
    compiled = kiln.compile(fn, backend=backend, options=ON)
    g = torch.Generator().manual_seed(2)
    for _ in range(CALLS):
        x = torch.randn(4, 5, generator=g)
        w = torch.randn(4, 5, generator=g, requires_grad=True)
        w_ref = w.detach().clone().requires_grad_(True)
        out, ref = compiled(x, w), fn(x, w_ref)
        _same(out[1:], ref[1:])
        torch.testing.assert_close(out[0], ref[0])
        out[0].backward()
        ref[0].backward()
        torch.testing.assert_close(w.grad, w_ref.grad)
    snap = counters.snapshot()
    breaks = 1 if fn is loss_across_break else 0
    assert snap.get("graph_breaks", {}) == ({"unsupported_call": 1} if breaks else {}), snap
    assert snap["stats"]["graphs_compiled"] == 1 + breaks, snap
    assert kiln.stats().recompiles == 0, snap


def test_options_off_break_at_item() -> None:
    compiled = kiln.compile(returns_float, backend="aot_eager")
    for (x,) in _vectors():
        _same(compiled(x), returns_float(x))
    assert counters.snapshot()["graph_breaks"] == {"data_dependent_value": 1}


class Tracking(torch.nn.Module):
    """Keeps statistics of its last batch as Python numbers (a side effect the frame replays)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total = x.sum().item()
        self.positive = int((x > 0).sum())
        return x * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_stored_on_module(backend: str) -> None:
    m = Tracking()
    compiled = kiln.compile(m, backend=backend, options=ON)
    for (x,) in _vectors():
        _same(compiled(x), x * 2)
        assert m.total == pytest.approx(x.sum().item(), rel=1e-5)
        assert m.positive == int((x > 0).sum()) and type(m.positive) is int
    snap = counters.snapshot()
    assert snap.get("graph_breaks", {}) == {}, snap
    assert snap["stats"]["graphs_compiled"] == 1 and kiln.stats().recompiles == 0, snap
