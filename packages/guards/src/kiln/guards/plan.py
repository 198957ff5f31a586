"""Which guards a check evaluates, and in what order.

Duplicates and guards implied by others go. Guards a ``MODULE_TREE`` guard's stamp
protects move into that tree's group (:mod:`kiln.guards.module_tree`). The rest run
cheapest and likeliest to fail first, by their kind's rank (:class:`~kiln.guards.kinds.Rank`):
single comparisons (constants, identities, types, module roots), then global torch state,
then container shapes, then every tensor in one expression, then hook registries. Within a
rank, shallower sources go first so a container's own guards run before guards on its items.
What decides each of these for a kind is declared by the kind (:mod:`kiln.guards.kinds`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kiln.capture.guard_data import GuardKind, GuardSpec, dedupe
from kiln.capture.source import AttrSource, ItemSource, Source
from kiln.guards import explain, module_tree, stamps
from kiln.guards.kinds import KINDS, Kind, kind_of

__all__ = ["Plan", "order", "rank", "source_depth"]


def rank(kind: GuardKind) -> int:
    """Where guards of ``kind`` run in a check (its :class:`~kiln.guards.kinds.Rank`)."""
    return kind_of(kind).rank


def source_depth(source: Source | None) -> int:
    """How many attributes and items ``source`` reads below its first other source."""
    return source.depth if isinstance(source, (AttrSource, ItemSource)) else 0


def _well_formed(kind: Kind, g: GuardSpec) -> bool:
    return (g.source is not None) == kind.has_source and kind.accepts(g.expected)


def _implied(g: GuardSpec, by_source: dict[str, list[GuardSpec]]) -> bool:
    """Whether another guard on the same source already checks ``g``."""
    others = [o for o in by_source.get(str(g.source), []) if o is not g]
    return kind_of(g.kind).implied(g, others)


Steps = tuple[tuple[str, Any], ...]  # ("attr", name) or ("item", key), from a root downwards


class _Trees:
    """The MODULE_TREE guards, shallowest first, found from a guard's source by the printed
    sources on its path: walking each guard's source up to each tree's root made the plan
    quadratic (guards times trees); this answers each distinct source once, from its base's
    answer, so guards sharing a path share the walk."""

    def __init__(self, kept: list[GuardSpec]) -> None:
        self.trees = sorted(
            (g for g in kept if g.kind is GuardKind.MODULE_TREE),
            key=lambda g: source_depth(g.source),
        )
        self._by_root: dict[str, list[int]] = {}
        for i, t in enumerate(self.trees):
            self._by_root.setdefault(str(t.source), []).append(i)
        # str(source) -> _above_source(source), and (tree index, steps) -> reach(): the
        # guards and modules outlive the plan, and module state does not change while it is made
        self._above: dict[str, list[tuple[int, Steps]]] = {}
        self._reached: dict[tuple[int, Steps], tuple[str, Any] | None] = {}

    def above(self, g: GuardSpec) -> list[tuple[int, Steps]]:
        """(tree index, steps from that tree's root down to ``g``'s source) for every tree
        but ``g`` whose root ``g``'s source is, or is below through attributes and items,
        in tree order."""
        if g.source is None:
            return []
        return [(i, steps) for i, steps in self._above_source(g.source) if self.trees[i] is not g]

    def _above_source(self, source: Source) -> list[tuple[int, Steps]]:
        key = str(source)
        found = self._above.get(key)
        if found is not None:
            return found
        found = [(i, ()) for i in self._by_root.get(key, ())]
        if isinstance(source, (AttrSource, ItemSource)):
            link = (
                ("attr", source.name) if isinstance(source, AttrSource) else ("item", source.index)
            )
            found += [(i, (*steps, link)) for i, steps in self._above_source(source.base)]
            found.sort(key=lambda hit: hit[0])  # a tree's root is on the path at most once
        self._above[key] = found
        return found

    def reach(self, i: int, steps: Steps) -> tuple[str, Any] | None:
        """:func:`module_tree.reach` from tree ``i``'s module, once per distinct path."""
        try:
            key = (i, steps)
            if key in self._reached:
                return self._reached[key]
        except TypeError:  # an unhashable item key: no memo
            return module_tree.reach(self.trees[i].expected, steps)
        found = self._reached[key] = module_tree.reach(self.trees[i].expected, steps)
        return found


def _tree_for(g: GuardSpec, trees: _Trees) -> tuple[GuardSpec, str] | None:
    """The shallowest tree whose stamp protects ``g`` (g holds now and can only change
    through module operations), if any, and how ``g``'s value hangs off it (``reach``)."""
    for tree, steps in trees.above(g):
        found = trees.reach(tree, steps)
        if found is None or found[0] not in kind_of(g.kind).stamp_protects:
            continue
        try:
            if explain.explain(g, found[1], where="") is None:  # only whether it holds
                return trees.trees[tree], found[0]
        except Exception:
            continue
    return None


def _buffer(source: Source | None) -> bool:
    """Whether ``source`` reads an item of a module's ``_buffers``."""
    return (
        isinstance(source, ItemSource)
        and isinstance(source.base, AttrSource)
        and source.base.name == "_buffers"
    )


def _tensor_part(tensors: list[GuardSpec]) -> list[GuardSpec] | None:
    """The guards of a group that a move of the stamp for tensors only
    (``stamps.bump_tensors``: a parameter's tensor swapped for another, a storage resized) can
    make fail: its guards on tensors, when each is a ``TENSOR_MATCH`` (whose storage test sees
    a resize) on a buffer (whose slot writes move the whole stamp, and whose metadata the
    group's record compares on every call) or on a tracked parameter (whose metadata changes
    move the whole stamp). None when one is not: the group then runs whole."""
    for g in tensors:
        if g.kind is not GuardKind.TENSOR_MATCH:
            return None
        if not (_buffer(g.source) or stamps.tracks_class(g.expected.type)):
            return None
    return tensors


@dataclasses.dataclass
class Plan:
    """Guards in evaluation order; each MODULE_TREE guard's group runs only when the stamp moved."""

    top: list[GuardSpec]
    groups: dict[int, list[GuardSpec]]  # id(tree guard) -> its group, in order
    # str(source) -> the submodule top-level guards read it as (see _bind_module_prefixes)
    bound: dict[str, Any] = dataclasses.field(default_factory=dict)
    # id(tree guard) -> the part of its group to run after a move for tensors only, in order
    # (``_tensor_part``); a tree without one runs its whole group after any move
    tensor_parts: dict[int, list[GuardSpec]] = dataclasses.field(default_factory=dict)

    def group(self, tree: GuardSpec) -> list[GuardSpec]:
        return self.groups.get(id(tree), [])

    def tensor_part(self, tree: GuardSpec) -> list[GuardSpec] | None:
        return self.tensor_parts.get(id(tree))

    def flat(self) -> list[GuardSpec]:
        """Every guard in the order the check runs them: the top level, then the groups."""
        return [*self.top, *(x for g in self.top for x in self.group(g))]


def _sort(guards: list[GuardSpec]) -> list[GuardSpec]:
    return sorted(guards, key=lambda g: (rank(g.kind), source_depth(g.source)))


def order(guards: list[GuardSpec], unsupported: Callable[[GuardSpec], Any]) -> Plan:
    """The plan of a check; ``unsupported`` raises for malformed guards."""
    for g in guards:
        kind = KINDS.get(g.kind)
        if kind is None or not _well_formed(kind, g):
            unsupported(g)
    kept = dedupe(list(guards))
    by_source: dict[str, list[GuardSpec]] = {}
    for g in kept:
        by_source.setdefault(str(g.source), []).append(g)
    kept = [g for g in kept if not _implied(g, by_source)]
    trees = _Trees(kept)
    top: list[GuardSpec] = []
    groups: dict[int, list[GuardSpec]] = {}
    tensors: dict[int, list[GuardSpec]] = {}  # id(tree) -> its group's guards on tensors
    for g in kept:
        found = _tree_for(g, trees)
        if found is None:
            top.append(g)
            continue
        tree, how = found
        groups.setdefault(id(tree), []).append(g)
        if how == "tensor":
            tensors.setdefault(id(tree), []).append(g)
    bound = _bind_module_prefixes(top, trees, groups)
    parts = {k: _tensor_part(tensors.get(k, [])) for k in groups}
    return Plan(
        _sort(top),
        {k: _sort(v) for k, v in groups.items()},
        bound,
        {k: _sort(v) for k, v in parts.items() if v is not None},
    )


def _deepest_module_prefix(g: GuardSpec, trees: _Trees) -> tuple[GuardSpec, Source, Any] | None:
    """(tree, prefix source, module) for the deepest submodule on ``g``'s source path that a
    tree reaches through module state, when there is one below the tree's root."""
    if g.source is None:
        return None
    for tree, steps in trees.above(g):
        if not steps:
            continue
        prefixes = [g.source]
        while len(prefixes) <= len(steps):
            base = prefixes[-1]
            assert isinstance(base, (AttrSource, ItemSource))
            prefixes.append(base.base)
        # prefixes[i] is the source i steps above g's; the root sits at len(steps)
        for k in range(len(steps) - 1, 0, -1):
            found = trees.reach(tree, steps[:k])
            if found is not None and found[0] == "module":
                return trees.trees[tree], prefixes[len(steps) - k], found[1]
    return None


# the guards that test a module's identity (a tree's root is its module)
_IDENTITIES = (GuardKind.MODULE_MATCH, GuardKind.MODULE_TREE)


def _bind_module_prefixes(
    top: list[GuardSpec], trees: _Trees, groups: dict[int, list[GuardSpec]]
) -> dict[str, Any]:
    """Let top-level guards start at submodules held by the check instead of walking to them
    on every call. Sound because the tree's group then checks each such submodule's identity
    whenever the module stamp moved, and the check's answer is the AND of everything."""
    bound: dict[str, Any] = {}
    identities: set[tuple[int, str]] = set()  # (id(tree), a source its group tests the identity of)
    for tree in trees.trees:
        for m in groups.get(id(tree), ()):
            if m.kind in _IDENTITIES:
                identities.add((id(tree), str(m.source)))
    for g in top:
        found = _deepest_module_prefix(g, trees)
        if found is None:
            continue
        tree, prefix, module = found
        key = str(prefix)
        if key in bound:
            continue
        bound[key] = module
        if (id(tree), key) not in identities:
            identities.add((id(tree), key))
            groups.setdefault(id(tree), []).append(
                GuardSpec(prefix, GuardKind.MODULE_MATCH, id(module))
            )
    return bound
