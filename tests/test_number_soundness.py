"""Python floats and data-dependent values whose algebra differs from sympy's.

A float argument that changes between calls is traced as a symbol, and sympy's reals are
finite and equal to themselves: ``p == inf`` folds to False and ``v != v`` to False. A symbolic
float therefore stands for finite values alone (an infinite or NaN argument is a constant,
guarded by value), a float read from data may be infinite, and a NaN test on one is decided
by the data. Each program runs against eager over calls whose values change.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import kiln
from kiln.capture import counters

INF = float("inf")
NAN = float("nan")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    counters.clear()
    yield
    kiln.reset()


def _same(expected: torch.Tensor, got: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-5, atol=1e-6)


def _norm(x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.norm(x, p)


@pytest.mark.parametrize("backend", ["kiln", "aot_eager"])
def test_norm_order_through_infinities(backend: str) -> None:
    # the order changes every call: -inf and inf are constants, the others one symbol whose
    # decomposition (amax for inf, the generic power sum otherwise) must not be reused for inf
    compiled = kiln.compile(_norm, backend=backend)
    for p in (-INF, INF, 3.0, 5.0, INF, 4.0, 2.5, NAN, 1.5, -INF):
        x = torch.randn(5, 5)
        _same(_norm(x, p), compiled(x, p))


def _halve_even(x: torch.Tensor, p: float) -> torch.Tensor:
    if p % 2 == 0:  # Python's float remainder: 3.5 % 2 is 1.5
        return x * (p / 2)
    return x - p


def test_float_remainder_is_not_an_integer() -> None:
    compiled = kiln.compile(_halve_even)
    for p in (3.0, 5.0, 4.0, 3.5, 6.0, 7.25, 1.0):
        x = torch.randn(4)
        _same(_halve_even(x, p), compiled(x, p))
    assert kiln.stats().eager_fallbacks == 0


def _scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    v1 = x / (2 + 3.5)
    return torch.where(v1 > 0, v1, v1 * 2) / (s + 3.5)


def test_float_expression_of_a_symbol_in_forward_and_backward() -> None:
    # s + 3.5 reaches kernels of the forward and, saved, of the backward: a float expression
    # is not index math, and the backward receives its value, not s
    compiled = kiln.compile(_scaled)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (2.0, -1.0, 0.5, 7.75):
            x = torch.randn(3, 2, requires_grad=True)
            x2 = x.detach().clone().requires_grad_()
            expected, got = _scaled(x, s), compiled(x2, s)
            _same(expected, got)
            expected.sum().backward()
            got.sum().backward()
            assert x.grad is not None and x2.grad is not None
            _same(x.grad, x2.grad)
    assert kiln.stats().recompiles <= 1


def _infinite_max(x: torch.Tensor) -> torch.Tensor:
    v = x.max().item()
    if v == INF:
        return x * 0
    return x * v


def _nan_max(x: torch.Tensor) -> torch.Tensor:
    v = x.max().item()
    if v != v:  # the NaN test
        return x * 0
    return x * v


def _isnan_max(x: torch.Tensor) -> torch.Tensor:
    v = x.max().item()
    return x * 0 if math.isnan(v) else x * v


@pytest.mark.parametrize("fn", [_infinite_max, _nan_max, _isnan_max])
def test_float_from_data_may_be_infinite_or_nan(fn: Callable[[torch.Tensor], Any]) -> None:
    compiled = kiln.compile(fn, options={"capture_scalar_outputs": True})
    for x in (
        torch.randn(4),
        torch.tensor([1.0, INF]),
        torch.tensor([1.0, NAN]),
        torch.randn(3),
    ):
        _same(fn(x), compiled(x))


def _split_by(x: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.tensor_split(x * 2, indices, 1)


def test_op_whose_kernel_reads_a_tensor_breaks_the_graph() -> None:
    # tensor_split by a tensor of indices reads its values: a graph break, not eager's error
    compiled = kiln.compile(_split_by)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for idx in ([1, 3], [2, 4], [0, 5]):
            x, indices = torch.randn(4, 6), torch.tensor(idx)
            for e, k in zip(_split_by(x, indices), compiled(x, indices), strict=True):
                _same(e, k)
    stats = kiln.stats()
    assert stats.eager_fallbacks == 0
    assert stats.graph_break_kinds == {"data-dependent operator": 1}, stats  # one capture


def _powers(x: torch.Tensor, s: float) -> tuple[Any, ...]:
    return x * s**2, x + s**0.5, x / 2**s, s**2


def test_float_powers_stay_symbolic() -> None:
    # s ** 2 is Pow(s, 2.0): a float power the graph computes, not a value fixed by a guard
    compiled = kiln.compile(_powers)
    for s in (1.5, 2.5, 3.5, 0.75):
        x = torch.randn(3)
        expected, got = _powers(x, s), compiled(x, s)
        for e, k in zip(expected[:3], got[:3], strict=True):
            _same(e, k)
        assert got[3] == pytest.approx(expected[3])
    assert kiln.stats().recompiles == 1  # the second value makes s a symbol; no more after


def _signed_powers(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s**2 + abs(s) - x / s**3


def test_whole_powers_and_abs_of_a_negative_float() -> None:
    # torch's SymFloat ** checks s >= 0 for any exponent; Python's s ** 2 is real for any s
    compiled = kiln.compile(_signed_powers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for s in (1.5, -2.5, 3.5, -0.75, 2.25):
            x = torch.randn(3)
            _same(_signed_powers(x, s), compiled(x, s))
    assert kiln.stats().recompiles == 1


def _item_then_break(x: torch.Tensor) -> torch.Tensor:
    s = x.sum().item()
    os.getpid()  # a graph break: s is handed to the continuation
    return x * s**2 + abs(s)


def test_number_from_data_powered_after_a_break() -> None:
    compiled = kiln.compile(_item_then_break, options={"capture_scalar_outputs": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            x = torch.randn(3)
            _same(_item_then_break(x), compiled(x))
    stats = kiln.stats()
    assert stats.recompiles == 0 and stats.eager_fallbacks == 0, stats


def _zero_an_expanded_view(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    v = y.unsqueeze(1).expand(-1, 3, -1)
    os.getpid()  # a graph break: the continuation takes the expanded view as an input
    v.zero_()  # eager fills a tensor whose elements repeat; copy_ would refuse to
    return x * 2


@pytest.mark.parametrize("backend", ["kiln", "aot_eager"])
def test_expanded_input_written_in_place(backend: str) -> None:
    compiled = kiln.compile(_zero_an_expanded_view, backend=backend)
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(2, 4)
        y2 = y.clone()
        _same(_zero_an_expanded_view(x, y), compiled(x, y2))
        _same(y, y2)
    assert kiln.stats().eager_fallbacks == 0


def _scale_by_any(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return x * m.any().item()


@pytest.mark.parametrize("backend", ["kiln", "aot_eager"])
def test_bool_from_data_scales_a_tensor(backend: str) -> None:
    compiled = kiln.compile(
        _scale_by_any, backend=backend, options={"capture_scalar_outputs": True}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for threshold in (0.0, 10.0, -10.0, 10.0):
            x, m = torch.randn(4), torch.randn(4) > threshold
            _same(_scale_by_any(x, m), compiled(x, m))
    stats = kiln.stats()
    assert stats.graph_breaks == 0 and stats.recompiles == 0, stats


def _distance(a: torch.Tensor, b: torch.Tensor, p: int) -> torch.Tensor:
    return torch.dist(a, b, p)


def test_int_argument_of_an_extern_op_changing_between_calls() -> None:
    # p becomes a symbol, and the graph compiled for each value passes that value to ATen's
    # dist as a Python int (it had passed sympy's Integer, which torch refuses)
    compiled = kiln.compile(_distance)
    for p in (2, 4, 3):
        a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        expected, got = _distance(a, b, p), compiled(a2, b2, p)
        _same(expected, got)
        expected.backward()
        got.backward()
        assert a.grad is not None and a2.grad is not None
        _same(a.grad, a2.grad)
    assert kiln.stats().eager_fallbacks == 0
