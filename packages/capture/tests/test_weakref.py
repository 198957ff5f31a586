"""``weakref.ref`` made in traced code (torch 2.11's ``Transform.inv`` keeps one).

Calling the reference gives the object while the trace holds it; one that leaves the frame
(returned, stored on an outside object) cannot be rebuilt, so the frame runs eagerly.
"""

from __future__ import annotations

import weakref

import pytest
import torch

from kiln.capture import Unsupported, capture


class Node:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self._inv: weakref.ref[Node] | None = None

    @property
    def inv(self) -> Node:  # the caching torch 2.11's Transform.inv does
        inv = None if self._inv is None else self._inv()
        if inv is None:
            inv = Node(-self.t)
            self._inv = weakref.ref(inv)
        return inv


def test_a_weakref_made_in_the_trace(check):
    def fn(x):
        n = Node(x * 2)
        first = n.inv
        return first.t + x, n.inv is first, n._inv() is first, type(n._inv) is weakref.ref

    check(fn, (torch.randn(3),))


def test_distribution_transform_inverse(check):
    def fn(x):
        t = torch.distributions.transforms.ExpTransform()
        return t.inv(x.abs() + 1), t.inv.inv is t

    check(fn, (torch.randn(3),))


def test_weakref_to_a_constant_raises_as_python_does(check):
    def fn(x):
        try:
            weakref.ref(3)
        except TypeError:
            return x + 1
        return x

    check(fn, (torch.randn(3),))


def test_an_escaping_weakref_is_refused():
    def fn(x):
        n = Node(x)
        return x * 2, weakref.ref(n)

    with pytest.raises(Unsupported, match="WeakRefValue"):
        capture(
            fn,
            (torch.randn(3),),
            {},
            compile_graph=lambda gm, ex: gm.forward,
            wrap_callable=lambda f: f,
        )
