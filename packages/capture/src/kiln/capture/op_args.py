"""An op's arguments and results walked as pytree walks them, faster for what ops take.

Every op capture evaluates on fakes walks its arguments a few times (to unwrap fakes, find the
result's device, check eager's refusals, look for symbolic sizes) and its results once (to
wrap them). What the dispatcher hands a mode is plain tuples, lists and dicts of tensors and
numbers, where pytree's registry lookups and namedtuple checks cost more than the walk: those
are walked here directly, anything else is left to pytree, so the answers are pytree's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["leaves", "map_leaves"]

# leaf types pytree never descends into
_LEAVES = frozenset(
    {
        int,
        float,
        bool,
        complex,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
        torch.SymInt,
        torch.SymFloat,
        torch.SymBool,
    }
)


def leaves(tree: Any) -> list[Any]:
    """``pytree.tree_leaves(tree)``."""
    found: list[Any] = []
    _collect(tree, found)
    return found


def _is_leaf(x: Any) -> bool:
    return type(x) in _LEAVES or isinstance(x, torch.Tensor)


def _collect(tree: Any, found: list[Any]) -> None:
    # leaves inside a container are taken where they stand, not through a call each
    kind = type(tree)
    if kind is tuple or kind is list or kind is dict:
        for item in tree.values() if kind is dict else tree:
            if type(item) in _LEAVES or isinstance(item, torch.Tensor):
                found.append(item)
            else:
                _collect(item, found)
    elif _is_leaf(tree):
        found.append(tree)
    else:
        found.extend(pytree.tree_leaves(tree))


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``pytree.tree_map(fn, tree)``."""
    kind = type(tree)
    if kind is tuple:
        return tuple([fn(x) if _is_leaf(x) else map_leaves(fn, x) for x in tree])
    if kind is list:
        return [fn(x) if _is_leaf(x) else map_leaves(fn, x) for x in tree]
    if kind is dict:
        return {k: fn(x) if _is_leaf(x) else map_leaves(fn, x) for k, x in tree.items()}
    if _is_leaf(tree):
        return fn(tree)
    return pytree.tree_map(fn, tree)
