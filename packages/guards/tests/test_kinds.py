"""The registry of guard kinds: every kind is declared once, and the planner, the code
generator and ``explain`` all take a kind's behaviour from its declaration."""

from __future__ import annotations

import functools
import types
from typing import Any

import pytest
import torch

from kiln import guards
from kiln.capture import guard_data
from kiln.capture.guard_data import GuardKind, GuardSpec
from kiln.capture.source import LocalSource
from kiln.guards import explain, plan
from kiln.guards.kinds import KINDS, Emitter, Kind, Rank, register
from kiln.guards.kinds.values import SequenceLength


def test_every_kind_capture_names_is_declared_once():
    assert set(KINDS) == set(GuardKind)
    for kind, declared in KINDS.items():
        assert declared.kind is kind
        assert isinstance(declared.rank, Rank)
        # both halves of a kind are its own: the check's expression and its words
        assert type(declared).condition is not Kind.condition, kind
        assert type(declared).explain is not Kind.explain, kind


def test_a_kind_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):

        @register(GuardKind.SEQUENCE_LENGTH)
        class Again(SequenceLength):
            pass

    assert type(KINDS[GuardKind.SEQUENCE_LENGTH]) is SequenceLength


class AtLeast(SequenceLength):
    """SEQUENCE_LENGTH read as "at least": another rank, expression and explanation."""

    rank = Rank.HOOKS

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"len({v}) >= {int(guard.expected)}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        n = len(value)
        return None if n >= guard.expected else f"len({where}) is {n}, under {guard.expected}"


def _pair(xs, x):
    return x


def test_the_declaration_is_the_one_place_plan_codegen_and_explain_read(monkeypatch):
    """Replacing one registry entry changes the order, the generated check and the failure
    message together: nothing else knows what the kind does."""
    monkeypatch.setitem(KINDS, GuardKind.SEQUENCE_LENGTH, AtLeast())
    xs, x = LocalSource("xs"), LocalSource("x")
    length = GuardSpec(xs, GuardKind.SEQUENCE_LENGTH, 2)
    has = GuardSpec(x, GuardKind.HASATTR, ("real", True))  # a container-rank guard
    assert plan.order([length, has], print).flat() == [has, length]  # now after it
    monkeypatch.setitem(KINDS, GuardKind.SEQUENCE_LENGTH, SequenceLength())
    assert plan.order([length, has], print).flat() == [length, has]  # as it came
    monkeypatch.setitem(KINDS, GuardKind.SEQUENCE_LENGTH, AtLeast())
    check = guards.build_check([length], _pair)
    assert "len(xs) >= 2" in check.source
    assert check([1, 2, 3], None) is True and check.failure_reason([1, 2, 3], None) is None
    assert check([1], None) is False
    assert check.failure_reason([1], None) == "len(L['xs']) is 1, under 2"


def test_a_kind_without_a_declaration_is_refused(monkeypatch):
    monkeypatch.delitem(KINDS, GuardKind.HASATTR)
    g = GuardSpec(LocalSource("x"), GuardKind.HASATTR, ("weight", True))
    with pytest.raises(guards.UnsupportedGuard):
        guards.build_check([g], _pair)
    assert explain.explain(g, torch.nn.Linear(1, 1)) == f"unknown guard kind {GuardKind.HASATTR}"


@pytest.mark.parametrize(
    ("guard", "passing", "failing"),
    [
        (GuardSpec(LocalSource("x"), GuardKind.EQUALS, 3), 3, 3.0),
        (GuardSpec(LocalSource("x"), GuardKind.EQUALS, float("nan")), float("nan"), 1.0),
        (GuardSpec(LocalSource("x"), GuardKind.FINITE), -2.5, float("inf")),
        (GuardSpec(LocalSource("x"), GuardKind.FINITE), 0.0, float("nan")),
        (GuardSpec(LocalSource("x"), GuardKind.BOOL, True), [1], []),
        (GuardSpec(LocalSource("x"), GuardKind.IS_NONE), None, 0),
        (GuardSpec(LocalSource("x"), GuardKind.NOT_NONE), 0, None),
        (GuardSpec(LocalSource("x"), GuardKind.TYPE_MATCH, dict), {}, []),
        (
            GuardSpec(LocalSource("x"), GuardKind.DICT_KEYS, ("a", "b")),
            {"a": 1, "b": 2},
            {"b": 2, "a": 1},
        ),
        (GuardSpec(LocalSource("x"), GuardKind.SEQUENCE_LENGTH, 2), (1, 2), (1,)),
        (GuardSpec(LocalSource("x"), GuardKind.HASATTR, ("real", True)), 1, "s"),
        (
            GuardSpec(LocalSource("x"), GuardKind.NOT_IN_INSTANCE_DICT, "f"),
            types.SimpleNamespace(g=1),
            types.SimpleNamespace(f=1),
        ),
        (GuardSpec(LocalSource("x"), GuardKind.HOOKS_EMPTY), torch.nn.Linear(1, 1), None),
    ],
    ids=lambda v: v.kind.value if isinstance(v, GuardSpec) else None,
)
def test_condition_and_explanation_agree(guard, passing, failing):
    """A kind's two halves say the same thing: the check passes exactly when ``explain``
    finds nothing wrong."""
    if guard.kind is GuardKind.HOOKS_EMPTY:
        failing = torch.nn.Linear(1, 1)
        failing.register_forward_hook(lambda *a: None)
    check = guards.build_check([guard], _pair)
    assert check(None, passing) is True
    assert explain.explain(guard, passing) is None
    assert check(None, failing) is False
    assert explain.explain(guard, failing) is not None


def test_cached_call_runs_last_and_agrees_with_its_explanation():
    """A ``CACHED_CALL`` guard calls user code: it runs after every other guard, and it holds
    while the cache hands back the traced constant (a recomputed equal one counts)."""
    state = {"k": 2}

    @functools.lru_cache
    def scale(n):
        return state["k"] * n

    cached = guard_data.CachedCall(scale, (3,), (), scale(3))
    guard = GuardSpec(None, GuardKind.CACHED_CALL, cached)
    others = [plan.rank(k) for k in KINDS if k is not GuardKind.CACHED_CALL]
    assert plan.rank(GuardKind.CACHED_CALL) > max(others)
    check = guards.build_check([guard], _pair)
    state["k"] = 5
    assert check(None, 1) is True and explain.explain(guard, None) is None  # still cached
    scale.cache_clear()
    assert check(None, 1) is False and explain.explain(guard, None) is not None
    state["k"] = 2
    scale.cache_clear()
    assert check(None, 1) is True  # recomputed: the same constant
