"""Python operators answered by either operand's kind: containers, constants, user objects.

Each program runs captured and eagerly (the ``check`` fixture) on fresh inputs; where eager
raises, the captured program breaks the graph before the operator and raises the same error.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kiln.capture import capture


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _raises_as_eager(fn: Callable[..., Any], *args: Any) -> None:
    result = capture(
        fn, args, {}, compile_graph=lambda gm, ex: gm.forward, wrap_callable=lambda f: f
    )
    with pytest.raises(Exception) as eager:
        fn(*args)
    with pytest.raises(type(eager.value), match=re.escape(str(eager.value))):
        result.function(*args)


def test_either_operand_of_a_pair_may_answer(check):
    def fn(x):
        t = (x, 1)
        s = {1, 2}
        d = {"a": x}
        return (
            (0,) + t,
            t + (2,),
            frozenset({2, 3}) | s,
            s & frozenset({2}),
            d.keys() | {"b"},
            {"a"} == d.keys(),
            (x, 1) == t,
            t != (x, 2),
        )

    check(fn, (r(3),), graphs=0)


def test_an_in_place_repeat_changes_the_list_every_alias_sees(check):
    def fn(x):
        a = [x]
        b = a
        a *= 2
        return b, len(a)

    check(fn, (r(3),), graphs=0)


def test_a_repeat_by_a_float_raises_as_eager():
    def fn(x):
        return [x] * 2.0

    _raises_as_eager(fn, r(3))


def test_a_tuple_joins_only_a_tuple():
    def fn(x):
        return (x, 1) + "ab"

    _raises_as_eager(fn, r(3))


def test_a_list_extends_in_place_by_a_constant_tuple(check):
    def fn(x):
        a = [x]
        b = a
        a += (1, 2)
        return b

    check(fn, (r(3),), graphs=0)


def test_a_size_joined_or_repeated_stays_a_size(check):
    def fn(x):
        n = x.size(0)
        t = (n, x)
        return x.shape + t[:1], t[:1] + x.shape, x.shape[:1] * 2, t[:1] * 2

    check(fn, (r(2, 3),), graphs=0)


def test_a_merge_with_an_ordered_dict_is_an_ordered_dict(check):
    def fn(x):
        o = collections.OrderedDict(a=x)
        return o | {"b": x}, {"b": x} | o, {"c": x} | {"d": 1}

    check(fn, (r(3),), graphs=0)


def test_dicts_equal_by_keys_and_values(check):
    def fn(x, d):
        e = {"a": 1, "b": x}
        ordered = collections.OrderedDict(a=1, b=2)
        return (
            x + 1 if e == {"b": x, "a": 1} else x - 1,
            {} == {},
            d == {"k": 2},
            e != {"a": 2, "b": x},
            ordered == collections.OrderedDict(b=2, a=1),
            ordered == {"b": 2, "a": 1},
        )

    check(fn, (r(3), {"k": 2}))


def test_a_list_never_equals_a_tuple_nor_a_constant(check):
    def fn(x):
        a = [1, 2]
        b = tuple(a)
        t = (x, 1)
        return x + 1 if a == b else x - 1, [x] != (x,), t == 3, "a" != t, [x] == 2.0

    check(fn, (r(3),))


def test_tensor_items_compare_by_identity_first_then_by_value(check):
    def same(x):
        return x + 1 if x in [x] and [x, 1] == [x, 1] else x - 1

    check(same, (r(3),))

    def other(x):
        y = x * 2
        return x + 1 if y in [x + 1, x] else x - 1

    # eager takes the truth of a two-element comparison, which raises
    _raises_as_eager(other, r(2))


class _AlwaysIn(dict):  # type: ignore[type-arg]
    def __contains__(self, key: object) -> bool:
        return True


def test_a_frame_dict_subclass_answers_in_with_its_own_contains(check):
    def fn(x, d):
        return x + 1 if "missing" in d else x - 1

    check(fn, (r(3), _AlwaysIn(a=1)))


class _Tagged(list):  # type: ignore[type-arg]
    def __add__(self, other):
        return _Tagged([*self, *other, "tagged"])

    def __eq__(self, other):
        return True


def test_a_container_subclass_operator_runs_its_own_dunder(check):
    def fn(x):
        a = _Tagged([x])
        b = a + [x * 2]
        return b, a == [1], [x] + a

    check(fn, (r(3),), graphs=1)


class _Point:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, _Point) and self.v == other.v


class _Base:
    def __add__(self, other):
        return "base add"

    def __lt__(self, other):
        return "base lt"


class _Derived(_Base):
    def __radd__(self, other):
        return "derived radd"

    def __gt__(self, other):
        return "derived gt"


class _NoAnswer:
    def __eq__(self, other):
        return NotImplemented


def test_user_dunders_follow_pythons_order_and_defaults(check):
    def fn(x):
        a, b, c = _Point(1), _Point(1), _Point(2)
        n, m = _NoAnswer(), _NoAnswer()
        return (
            x + 1 if a != b else x - 1,  # object.__ne__ inverts __eq__
            a != c,
            _Base() + _Derived(),  # a subclass's own reflected method goes first
            _Base() < _Derived(),
            n == m,  # both NotImplemented: identity
            n != m,
            n == n,
        )

    check(fn, (r(3),))


def test_user_dunders_answer_from_either_side(check):
    class Box:
        def __init__(self, v):
            self.v = v

        def __add__(self, other):
            return Box(self.v + other)

        def __radd__(self, other):
            return Box(other * self.v)

        def __eq__(self, other):
            return isinstance(other, Box) and self.v is other.v

        def __neg__(self):
            return Box(-self.v)

    def fn(x):
        a, b = Box(x), Box(x)
        return (a + 1).v, (2 + a).v, (-a).v, a == b, [1, a] == [1, b], a in [b]

    check(fn, (r(3),))
