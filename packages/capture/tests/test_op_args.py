"""op_args walks an op's arguments and results as pytree does."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

from kiln.capture.op_args import leaves, map_leaves

Point = collections.namedtuple("Point", "x y")
_t = torch.ones(2)
TREES: list[Any] = [
    _t,
    3,
    None,
    ((_t, 2.5, [1, 2, (3, None)]), {"dim": -1, "dtype": torch.float16, "out": [_t, _t]}),
    ([], (), {}),
    torch.Size([2, 3]),
    (torch.Size([4]), [torch.device("cpu"), torch.strided, torch.channels_last, "mean", True]),
    Point(_t, [1, {"a": 2}]),
    torch.max(torch.ones(3, 2), 1),
    collections.OrderedDict(b=1, a=(_t, 2)),
    {"b": 1, "a": 2},
]


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_leaves_and_map_are_pytrees(tree: Any) -> None:
    assert _same(leaves(tree), pytree.tree_leaves(tree))

    def fn(x: Any) -> Any:
        return ("leaf", x)

    mapped, expected = map_leaves(fn, tree), pytree.tree_map(fn, tree)
    assert type(mapped) is type(expected)
    assert pytree.tree_structure(mapped) == pytree.tree_structure(expected)
    assert _same(pytree.tree_leaves(mapped), pytree.tree_leaves(expected))


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y or (type(x) is type(y) and x == y) for x, y in zip(a, b))
