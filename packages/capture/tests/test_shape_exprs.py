"""Range reasoning on shape expressions: ``decide`` answers exactly what the costly bound
search answers, with sampled points only skipping searches that cannot succeed."""

from __future__ import annotations

import random

import sympy
import torch

from kiln.capture.shapes import ShapeEnv
from kiln.capture.shapes.exprs import (
    INF,
    FloorDiv,
    Mod,
    Range,
    bounds,
    decide,
    decide_range,
    reduce_by_ranges,
    sample_values,
    tight_bounds,
)
from kiln.capture.shapes.node import SymNode, wrap
from kiln.capture.source import LocalSource

s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
_RANGES = {s0: Range(2, INF), s1: Range(2, 64)}


def _slow(relation: sympy.Basic) -> bool | None:
    """The answer without samples: interval bounds, then the bound search."""
    diff = relation.lhs - relation.rhs
    quick = decide_range(relation, bounds(diff, _RANGES))
    return quick if quick is not None else decide_range(relation, tight_bounds(diff, _RANGES))


def _expressions() -> list[sympy.Expr]:
    f = FloorDiv(s0 - 1, 8) + 1
    return [s0, s1, f, f**2, s0 * s1, FloorDiv(s0, s1), Mod(s0, 4), s0 - s1, 2 * f - 1, f * s1]


def test_decide_answers_as_the_bound_search() -> None:
    rng = random.Random(0)
    exprs = _expressions()
    kinds = [sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge]
    for _ in range(300):
        a, b = rng.choice(exprs), rng.choice(exprs) + rng.randint(-2, 2)
        relation = rng.choice(kinds)(a, b, evaluate=False)
        assert decide(relation, _RANGES) == _slow(relation), relation


def test_a_question_with_both_answers_in_range_is_undecided() -> None:
    f = FloorDiv(s0 - 1, 16) + 1  # 1 for s0 <= 16, more above
    assert decide(sympy.Ne(f**2, 1, evaluate=False), _RANGES) is None
    assert decide(sympy.Ge(f**2, f, evaluate=False), _RANGES) is True


def test_samples_are_points_in_range_with_exact_values() -> None:
    assert sample_values(s0 * s1, _RANGES) == [4, 9, 1011 * 64]
    assert sample_values(FloorDiv(s0, s1 - 2), _RANGES) == [3, 1011 // 62]  # 2 // 0 left out
    assert sample_values(s0 / 4, _RANGES) == []  # fractions at 2, 3 and 1011
    assert sample_values(s0, {s0: Range(-INF, 5)}) == [5, 4, -1004]


def test_reduce_by_ranges_keeps_what_samples_refute() -> None:
    assert reduce_by_ranges(Mod(s1, s0 * s1), _RANGES) == s1
    kept = Mod(s0, s1)  # s0 < s1 at some sizes only
    assert reduce_by_ranges(kept, _RANGES) == kept
    assert reduce_by_ranges(sympy.Max(s0, FloorDiv(s0, 2)), _RANGES) == s0


def test_max_of_sizes_picks_the_side_the_ranges_prove() -> None:
    env = ShapeEnv()
    a = wrap(SymNode(env.create_symbol(37, LocalSource("a")), env, int, 37))
    assert isinstance(a, torch.SymInt)
    out = (a - 1) // 8 + 1  # at least 1 for every a >= 2
    assert torch.sym_max(out, 1).node.expr == out.node.expr
    assert torch.sym_min(out, 1) == 1
    mixed = torch.sym_max(out, 5)  # 5 is the larger below a = 33: both sides stay
    assert isinstance(mixed.node.expr, sympy.Max) and mixed.node.hint == 5
    assert not env.recorded  # ranges decided, no guard


def test_mod_of_a_value_that_may_be_negative_spans_the_divisor() -> None:
    # Python's -1 % 8 is 7: the bound a % b <= a holds for a >= 0 only (an attention mask
    # padded by (8 - n % 8) % 8 was taken as never padded)
    for value in (-s0, -Mod(s0, 8), s1 - 10):
        assert bounds(Mod(value, 8), _RANGES) == Range(0, 7)
        assert decide_range(sympy.Ge(0, Mod(value, 8)), bounds(-Mod(value, 8), _RANGES)) is None
    assert bounds(Mod(s1, 8), _RANGES) == Range(0, 7)
    assert bounds(Mod(s1 - 2, 100), _RANGES) == Range(0, 62)
    assert _slow(sympy.Ge(Mod(-s0, 8), 1)) is None  # 0 for s0 = 8, 7 for s0 = 9


def test_floor_division_of_a_value_without_a_bound() -> None:
    """A strided convolution's size ``(t - 5) // 2`` where ``t`` has no bound on a side: the
    quotient's bound on that side is infinite, not an error."""
    t = sympy.Symbol("t", integer=True)
    assert bounds(FloorDiv(t - 5, 2), {t: Range(-INF, INF)}) == Range(-INF, INF)
    assert bounds(FloorDiv(t - 5, 2), {t: Range(2, INF)}) == Range(-2, INF)
    assert bounds(FloorDiv(-t, 2), {t: Range(3, INF)}) == Range(-INF, -2)
    assert bounds(FloorDiv(t, s1), {t: Range(0, INF), s1: Range(2, INF)}) == Range(0, INF)
    assert bounds(FloorDiv(t, s1), {t: Range(-9, -3), s1: Range(2, 3)}) == Range(-5, -1)
