"""Which guards a check evaluates, and in what order.

Duplicates and guards implied by others go; the rest run cheapest and likeliest to
fail first: single comparisons (constants, identities, types, the module stamp),
then global torch state, then container shapes, then every tensor in one
expression, then hook registries. Within a rank, shallower sources go first so a
container's own guards run before guards on its items.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.guard_data import GuardKind, GuardSpec, TensorMeta, dedupe
from kiln.capture.source import AttrSource, ItemSource, Source
from kiln.guards import checks, module_tree

__all__ = ["order", "rank", "source_depth"]

_RANK = {
    GuardKind.EQUALS: 0,
    GuardKind.BOOL: 0,
    GuardKind.IS_NONE: 0,
    GuardKind.NOT_NONE: 0,
    GuardKind.TYPE_MATCH: 0,
    GuardKind.ID_MATCH: 0,
    GuardKind.MODULE_MATCH: 0,
    GuardKind.MODULE_TREE: 0,
    GuardKind.GLOBAL_STATE: 1,
    GuardKind.SEQUENCE_LENGTH: 2,
    GuardKind.DICT_KEYS: 2,
    GuardKind.HASATTR: 2,
    GuardKind.TENSOR_MATCH: 3,
    GuardKind.HOOKS_EMPTY: 4,
}


def rank(kind: GuardKind) -> int:
    return _RANK.get(kind, 5)


def source_depth(source: Source | None) -> int:
    depth = 0
    while isinstance(source, (AttrSource, ItemSource)):
        depth += 1
        source = source.base
    return depth


def _known_type(g: GuardSpec) -> type | None:
    """The exact type a guard pins its source to, if it does."""
    if g.kind is GuardKind.TENSOR_MATCH:
        meta: TensorMeta = g.expected
        return meta.type
    if g.kind is GuardKind.TYPE_MATCH:
        return g.expected  # type: ignore[no-any-return]
    if g.kind is GuardKind.EQUALS:
        return type(g.expected)
    if g.kind is GuardKind.MODULE_TREE:
        return torch.nn.Module
    return None


def _implied(g: GuardSpec, by_source: dict[str, list[GuardSpec]]) -> bool:
    """Whether another guard on the same source already checks ``g``."""
    others = [o for o in by_source.get(str(g.source), []) if o is not g]
    if g.kind is GuardKind.NOT_NONE:
        return any(t is not None and t is not type(None) for t in map(_known_type, others))
    if g.kind is GuardKind.TYPE_MATCH:
        return any(
            o.kind in (GuardKind.TENSOR_MATCH, GuardKind.EQUALS) and _known_type(o) is g.expected
            for o in others
        )
    return False


# What a MODULE_TREE guard pins, by how it pins it (module_tree.reach), and the guard
# kinds that then cannot fail while the tree guard passes.
_PINNED = {
    "module": frozenset(
        {
            GuardKind.MODULE_MATCH,
            GuardKind.ID_MATCH,
            GuardKind.TYPE_MATCH,
            GuardKind.NOT_NONE,
            GuardKind.HOOKS_EMPTY,
            GuardKind.MODULE_TREE,
        }
    ),
    "tensor": frozenset(
        {GuardKind.TENSOR_MATCH, GuardKind.ID_MATCH, GuardKind.TYPE_MATCH, GuardKind.NOT_NONE}
    ),
    "value": frozenset(
        {
            GuardKind.EQUALS,
            GuardKind.BOOL,
            GuardKind.IS_NONE,
            GuardKind.NOT_NONE,
            GuardKind.TYPE_MATCH,
        }
    ),
    "identity": frozenset(
        {GuardKind.ID_MATCH, GuardKind.TYPE_MATCH, GuardKind.NOT_NONE, GuardKind.IS_NONE}
    ),
}


def _steps_below(source: Source | None, root: str) -> list[tuple[str, Any]] | None:
    """The attribute/item steps from the source printed ``root`` down to ``source``."""
    steps: list[tuple[str, Any]] = []
    while source is not None and str(source) != root:
        if isinstance(source, AttrSource):
            steps.append(("attr", source.name))
        elif isinstance(source, ItemSource):
            steps.append(("item", source.index))
        else:
            return None
        source = source.base
    return steps[::-1] if source is not None else None


def _pinned_by_tree(g: GuardSpec, trees: list[GuardSpec]) -> bool:
    """Whether a MODULE_TREE guard on an enclosing module already checks ``g``."""
    for t in trees:
        if t is g:
            continue
        steps = _steps_below(g.source, str(t.source))
        found = module_tree.reach(t.expected, steps) if steps is not None else None
        if found is not None and g.kind in _PINNED[found[0]]:
            try:
                if checks.explain(g, found[1]) is None:
                    return True
            except Exception:
                continue
    return False


def _snapshot_trees(guards: list[GuardSpec]) -> list[GuardSpec]:
    return [
        GuardSpec(g.source, g.kind, module_tree.snapshot(str(g.source), g.expected))
        if g.kind is GuardKind.MODULE_TREE and isinstance(g.expected, torch.nn.Module)
        else g
        for g in guards
    ]


def order(guards: list[GuardSpec], unsupported: Callable[[GuardSpec], Any]) -> list[GuardSpec]:
    """The guards a check evaluates, in evaluation order; ``unsupported`` raises for bad ones."""
    for g in guards:
        if g.kind not in _RANK or (g.source is None) != (g.kind is GuardKind.GLOBAL_STATE):
            unsupported(g)
    kept = _snapshot_trees(dedupe(list(guards)))
    by_source: dict[str, list[GuardSpec]] = {}
    for g in kept:
        by_source.setdefault(str(g.source), []).append(g)
    trees = [g for g in kept if g.kind is GuardKind.MODULE_TREE]
    kept = [g for g in kept if not _implied(g, by_source) and not _pinned_by_tree(g, trees)]
    return sorted(kept, key=lambda g: (rank(g.kind), source_depth(g.source)))
