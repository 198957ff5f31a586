"""Dedup, implied guards and evaluation order."""

from __future__ import annotations

import pytest
import torch

from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import AttrSource, LocalSource
from kiln.guards import plan


def raise_unsupported(g):
    raise ValueError(str(g))


x = LocalSource("x")
TENSOR = GuardSpec(x, GuardKind.TENSOR_MATCH, TensorMeta.of(torch.randn(2)))


def order(guards):
    return plan.order(guards, raise_unsupported)


def test_duplicates_and_implied_guards_go():
    ordered = order(
        [
            TENSOR,
            TENSOR,
            GuardSpec(x, GuardKind.NOT_NONE),
            GuardSpec(x, GuardKind.TYPE_MATCH, torch.Tensor),
        ]
    )
    assert ordered.flat() == [TENSOR]


def test_cheap_first_then_state_then_tensors_then_hooks():
    s = LocalSource("self")
    guards = [
        GuardSpec(s, GuardKind.HOOKS_EMPTY),
        TENSOR,
        GuardSpec(LocalSource("xs"), GuardKind.SEQUENCE_LENGTH, 2),
        GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current()),
        GuardSpec(AttrSource(s, "n"), GuardKind.EQUALS, 1),
        GuardSpec(s, GuardKind.TYPE_MATCH, torch.nn.Linear),
    ]
    kinds = [g.kind for g in order(guards).flat()]
    assert kinds == [
        GuardKind.TYPE_MATCH,  # depth 0 before the attribute's depth 1
        GuardKind.EQUALS,
        GuardKind.GLOBAL_STATE,
        GuardKind.SEQUENCE_LENGTH,
        GuardKind.TENSOR_MATCH,
        GuardKind.HOOKS_EMPTY,
    ]


def test_malformed_guards_are_reported():
    with pytest.raises(ValueError):
        order([GuardSpec(x, GuardKind.GLOBAL_STATE, GlobalState.current())])
    with pytest.raises(ValueError):
        order([GuardSpec(x, GuardKind.MODULE_TREE, 3)])


def test_tree_groups_what_its_stamp_protects():
    class Cfg:
        hidden = 4

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    model.eps = 0.5
    model.cfg = Cfg()
    s = LocalSource("self")
    first = s.item(0)
    protected = [
        GuardSpec(s, GuardKind.MODULE_MATCH, id(model)),
        GuardSpec(s.attr("training"), GuardKind.BOOL, True),
        GuardSpec(first, GuardKind.MODULE_MATCH, id(model[0])),
        GuardSpec(first, GuardKind.HOOKS_EMPTY),
        GuardSpec(first.attr("weight"), GuardKind.TENSOR_MATCH, TensorMeta.of(model[0].weight)),
        GuardSpec(first.attr("in_features"), GuardKind.EQUALS, 2),
        GuardSpec(s.attr("eps"), GuardKind.EQUALS, 0.5),
        GuardSpec(s.attr("cfg"), GuardKind.TYPE_MATCH, Cfg),
        GuardSpec(first, GuardKind.MODULE_TREE, model[0]),  # a nested tree joins the outer group
    ]
    unprotected = [
        GuardSpec(s.attr("cfg").attr("hidden"), GuardKind.EQUALS, 4),  # inside a plain object
        GuardSpec(first.attr("forward"), GuardKind.ID_MATCH, 123),  # a class attribute
        GuardSpec(s.attr("eps"), GuardKind.EQUALS, 0.25),  # does not hold now: fails every call
        GuardSpec(LocalSource("x"), GuardKind.EQUALS, 1),  # outside the tree
    ]
    tree = GuardSpec(s, GuardKind.MODULE_TREE, model)
    p = order([*protected, tree, *unprotected])
    assert {str(g) for g in p.group(tree)} == {str(g) for g in protected}
    assert {str(g) for g in p.top} == {str(g) for g in [tree, *unprotected]}
    assert p.flat() == [*p.top, *p.group(tree)]  # groups run after the top level
