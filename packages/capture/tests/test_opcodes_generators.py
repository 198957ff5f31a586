"""Generators inlined where the traced code consumes them, ``yield from`` included."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kiln.capture import explain

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from opcode_checks import check_calls  # noqa: E402


def halves(x: torch.Tensor) -> Iterator[torch.Tensor]:
    yield x[: x.shape[0] // 2]
    yield x[x.shape[0] // 2 :]
    return x.shape[0]


def delegate(x: torch.Tensor) -> Iterator[torch.Tensor]:
    n = yield from halves(x)
    yield x.sum() * n
    yield from [x.mean(), x.amax()]
    yield from (v * 2 for v in (x.min(), x.max()))


def nested(x: torch.Tensor) -> Iterator[torch.Tensor]:
    yield from delegate(x)
    yield from ()


def test_sum_of_a_generator() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return sum(v.sum() for v in halves(x.sin()))

    check_calls(fn, lambda i: (torch.randn(4 + 2 * i),), graphs=1)


def test_list_of_yield_from_with_the_inner_return_value() -> None:
    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        return list(delegate(x.cos()))

    check_calls(fn, lambda i: (torch.randn(6 + 2 * i),), graphs=1)


def test_yield_from_two_levels_deep() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros(())
        for v in nested(x):
            total = total + v.sum()
        return total

    check_calls(fn, lambda i: (torch.randn(4),), graphs=1)


def test_module_parameters_and_named_modules() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(3, 4)
            self.b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            dtype = next(self.parameters()).dtype
            count = sum(p.numel() for p in self.parameters())
            names = [n for n, _ in self.named_modules()]
            return self.b(self.a(x.to(dtype))) * count + len(names)

    net = Net()
    check_calls(net, lambda i: (torch.randn(2, 3),), graphs=1)


def test_generator_return_value_through_yield_from_chain() -> None:
    def inner(x: torch.Tensor) -> Iterator[torch.Tensor]:
        yield x
        return x * 3

    def middle(x: torch.Tensor) -> Iterator[torch.Tensor]:
        r = yield from inner(x)
        r2 = yield from inner(r)
        return r2 + 1

    def outer(x: torch.Tensor) -> Iterator[torch.Tensor]:
        last = yield from middle(x)
        yield last

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(outer(x.exp()))

    check_calls(fn, lambda i: (torch.randn(3),), graphs=1)


def _fails_after_one(x: torch.Tensor) -> Iterator[torch.Tensor]:
    yield x * 2
    raise ValueError("after the first item")


def test_an_error_after_the_items_taken_is_never_raised() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        first = next(_fails_after_one(x))
        for v in _fails_after_one(x + 1):
            first = first + v
            break
        return first

    check_calls(fn, lambda i: (torch.randn(3),), graphs=1)


def test_an_error_is_raised_where_the_consumer_reaches_it() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros(())
        try:
            for v in _fails_after_one(x):
                total = total + v.sum()
        except ValueError:
            total = total * 10
        return total

    check_calls(fn, lambda i: (torch.randn(3),), graphs=1)


def _count_up(n: int) -> Iterator[int]:
    yield from range(n)


@pytest.mark.parametrize("make", [lambda n: iter(list(range(n))), _count_up])
def test_a_loop_over_an_iterator_handed_in_advances_it_in_python(make: Any) -> None:
    def fn(x: torch.Tensor, it: Iterator[int]) -> torch.Tensor:
        y = x.sin()
        for v in it:
            y = y + v
        return y.cos()

    # each item is taken in Python; the body and the rest of the frame stay graphs
    for n in (3, 1):
        x = torch.randn(3)
        report = explain(fn)(x, make(n))  # the iterator is consumed: eager gets its own
        torch.testing.assert_close(report.result, fn(x, make(n)))
        assert [b.kind for b in report.breaks] == ["unsupported_value"] * (n + 1)
        assert report.ops_per_graph == [["sin"], *[["add"]] * n, ["cos"]]


def _echo(x: torch.Tensor) -> Iterator[torch.Tensor]:
    v = yield x
    yield x * (1 if v is None else v)


def test_sending_into_an_inlined_generator_runs_the_frame_as_python() -> None:
    # the items were computed with None sent: a frame that sends a value runs eagerly
    def fn(x: torch.Tensor) -> torch.Tensor:
        g = _echo(x.sin())
        first = next(g)
        return first + g.send(3)

    x = torch.randn(3)
    report = explain(fn)(x)
    torch.testing.assert_close(report.result, fn(x))
    assert report.graph_count == 0 and report.breaks[0].kind == "unsupported_attribute"
