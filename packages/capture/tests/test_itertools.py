"""``itertools`` in traced code: one graph, Python's values, Python's laziness.

Each program runs captured and eagerly (the ``check`` fixture) on fresh inputs. The lazy
iterators must advance what they read only as far as their consumer asks (a shared iterator
keeps the rest), infinite ones must work under a consumer that stops, and a graph break in a
loop over one must resume with the items it still yields.
"""

from __future__ import annotations

import itertools
import operator

import pytest
import torch
from torch.nn.modules.utils import _pair, _quadruple, _triple

from kiln.capture import Unsupported, capture


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def xs(n: int = 4) -> list[torch.Tensor]:
    return [r(3) for _ in range(n)]


def test_torch_ntuple_helpers(check):
    # torch.nn.modules.utils' parse is ``tuple(repeat(x, n))``
    def fn(x):
        k, s, p = _pair(3), _triple(x.shape[0]), _quadruple(2)
        return x * k[1] + s[2] - len(p) + p[3]

    check(fn, (r(3),))


def test_finite_iterators(check):
    def fn(xs):
        return (
            list(itertools.repeat(xs[0], 3)),
            list(itertools.repeat(xs[0], -1)),
            list(itertools.accumulate(xs)),
            list(itertools.accumulate(xs, operator.mul, initial=xs[0])),
            [a - b for a, b in itertools.pairwise(xs)],
            [a if b is None else a + b for a, b in itertools.zip_longest(xs, xs[:2])],
            list(itertools.zip_longest(xs[:1], [1, 2], fillvalue=-1)),
            list(itertools.chain(xs[:1], (xs[3],), xs[1:2])),
            list(itertools.chain.from_iterable([xs[:1], xs[2:]])),
            list(itertools.compress(xs, [1, 0, 1, 0])),
            list(itertools.starmap(torch.add, zip(xs, xs))),
            list(itertools.takewhile(lambda t: t[0] < 2, enumerate(xs))),
            list(itertools.dropwhile(lambda t: t[0] < 2, enumerate(xs))),
            list(itertools.filterfalse(lambda t: t[0] % 2, enumerate(xs))),
            [a * b for a, b in itertools.combinations(xs, 2)],
            [a - b for a, b in itertools.permutations(xs[:3], 2)],
            list(itertools.combinations_with_replacement(range(3), 2)),
            [a + b for a, b in itertools.product(xs[:2], repeat=2)],
            list(itertools.islice(xs, 1, None, 2)),
            list(itertools.islice(xs, 2)),
        )

    check(fn, (xs(),))


def test_infinite_iterators_under_a_consumer_that_stops(check):
    def fn(xs):
        counted = [x * i for i, x in zip(itertools.count(1, 2), xs)]
        floats = list(itertools.islice(itertools.count(0.5, 0.25), 3))
        cycled = list(itertools.islice(itertools.cycle(xs[:2]), 5))
        repeated = [a + b for a, b in zip(itertools.repeat(xs[1]), xs)]
        return counted, floats, cycled, repeated, next(itertools.repeat(xs[2]))

    check(fn, (xs(),))


def test_a_shared_iterator_keeps_what_islice_did_not_read(check):
    def fn(xs):
        it = iter(xs)
        head = list(itertools.islice(it, 2))
        rest = list(it)
        it2 = iter(xs)
        first = next(itertools.chain(it2, xs))
        return head, rest, first * 2, list(it2)

    check(fn, (xs(),))


def test_bad_arguments_raise_what_python_raises(check):
    def fn(x):
        caught = 0
        for bad in (lambda: itertools.islice([x], -1), lambda: itertools.repeat(x, 1.5)):
            try:
                bad()
            except (ValueError, TypeError):
                caught += 1
        return x * caught

    check(fn, (r(3),))


def test_python_types(check):
    def fn(x):
        its = (itertools.repeat(x), itertools.count(), itertools.chain(), itertools.islice([], 1))
        kinds = (itertools.repeat, itertools.count, itertools.chain, itertools.islice)
        return x + 1, [isinstance(it, k) for it, k in zip(its, kinds, strict=True)]

    check(fn, (r(3),))


def test_graph_break_in_a_loop_over_a_lazy_iterator(check):
    def fn(x, xs):
        total = x
        for i, v in zip(itertools.count(), itertools.chain(xs, [x])):
            total = total + v * i
            if total.sum() > 0:  # a break each step: the loop goes on with the rest
                total = total - 1
        return total

    result = check(fn, (r(3), xs(3)), graphs=1)
    assert [b.kind for b in result.graph_breaks] == ["data_dependent_branch"]


def test_two_live_iterators_over_one_are_not_resumed_apart():
    # each would be handed on as its own list of what remains: ``list(it)`` would see the
    # items enumerate already took
    def fn(x):
        it = iter([1, 2, 3, 4])
        total = x
        for i, v in enumerate(it):
            total = total * v
            if x.sum() > 0:
                total = total + 1
            if i == 1:
                break
        return total, list(it)

    with pytest.raises(Unsupported):
        capture(fn, (r(3),), {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f)


@pytest.mark.skipif(not hasattr(itertools, "batched"), reason="itertools.batched is 3.12's")
def test_batched(check):
    def fn(xs):
        return [torch.stack(b).sum(0) for b in itertools.batched(xs, 2)]

    check(fn, (xs(5),))
