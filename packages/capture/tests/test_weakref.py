"""``weakref.ref`` made in traced code (torch 2.11's ``Transform.inv`` keeps one), and
called from the frame (``nn.RNNBase`` keeps one per weight).

Calling the reference gives the object while the trace holds it; one that leaves the frame
(returned, stored on an outside object) cannot be rebuilt, so the frame runs eagerly. A
reference from the frame is pinned by identity, and its referent read through the call.
"""

from __future__ import annotations

import weakref

import pytest
import torch

from kiln.capture import Unsupported, capture
from kiln.capture.guard_data import GuardKind


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


class Holder:
    """A weight and a weak reference to it, as ``nn.RNNBase`` keeps (``_flat_weight_refs``)."""

    def __init__(self) -> None:
        self.weight = torch.nn.Parameter(torch.randn(3))
        self.ref = weakref.ref(self.weight)
        self.other = torch.nn.Parameter(torch.randn(3))


def test_a_weakref_from_the_frame_gives_its_referent_pinned(check):
    holder = Holder()

    def fn(x):
        same = holder.ref() is holder.weight
        return x * holder.ref() if same else x, same, holder.ref() is holder.other

    result = check(fn, (torch.randn(3),))
    pinned = {str(g.source) for g in result.guards if g.kind is GuardKind.ID_MATCH}
    assert {"C['holder'].ref", "C['holder'].ref()", "C['holder'].weight"} <= pinned
    assert "C['holder'].other" in pinned


def test_a_dead_weakref_from_the_frame_gives_none(check):
    holder = Holder()
    holder.ref = weakref.ref(torch.nn.Parameter(torch.randn(3)))  # nothing else holds it

    def fn(x):
        return x + 1 if holder.ref() is None else x

    result = check(fn, (torch.randn(3),))
    kinds = {str(g.source): g.kind for g in result.guards if g.source is not None}
    assert kinds["C['holder'].ref()"] is GuardKind.IS_NONE


def test_two_input_tensors_that_are_not_parameters_still_break_on_identity():
    """Inputs are new objects on most calls: pinning them would recompile every call."""

    def fn(x, y):
        return x + 1 if x is y else x

    result = capture(
        fn,
        (torch.randn(3), torch.randn(3)),
        {},
        compile_graph=lambda gm, ex: gm.forward,
        wrap_callable=lambda f: f,
    )
    assert ["identity of two input tensors" in str(b) for b in result.graph_breaks] == [True]
