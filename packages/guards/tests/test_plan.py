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


def test_duplicates_and_implied_guards_go():
    ordered = plan.order(
        [
            TENSOR,
            TENSOR,
            GuardSpec(x, GuardKind.NOT_NONE),
            GuardSpec(x, GuardKind.TYPE_MATCH, torch.Tensor),
        ],
        raise_unsupported,
    )
    assert ordered == [TENSOR]


def test_module_tree_subsumes_identity_and_snapshots():
    m = torch.nn.Linear(2, 2)
    s = LocalSource("self")
    ordered = plan.order(
        [GuardSpec(s, GuardKind.MODULE_MATCH, id(m)), GuardSpec(s, GuardKind.MODULE_TREE, m)],
        raise_unsupported,
    )
    assert [g.kind for g in ordered] == [GuardKind.MODULE_TREE]
    assert ordered[0].expected.root is m


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
    kinds = [g.kind for g in plan.order(guards, raise_unsupported)]
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
        plan.order([GuardSpec(x, GuardKind.GLOBAL_STATE, GlobalState.current())], raise_unsupported)
