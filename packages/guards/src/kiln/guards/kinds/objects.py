"""Guard kinds on objects by identity, and on modules: which object, which module tree,
which hooks.

Each class is everything kiln.guards does with its kind (see :mod:`kiln.guards.kinds.base`).
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from kiln.capture.guard_data import ClassAttr, GuardKind, GuardSpec
from kiln.guards import hooks
from kiln.guards.kinds.base import Emitter, Kind, Rank, register
from kiln.guards.kinds.values import ANY_REACH

__all__ = ["ClassAttrKind", "HooksEmpty", "IdMatch", "ModuleMatch", "ModuleTree"]


class _Identity(Kind):
    """``expected`` is the ``id()`` of the object. A source the check can read without a frame
    (a global, a closure cell) is compared with ``is`` against the object itself, held weakly:
    a weak reference, unlike an id, never matches another object that took a dead one's id."""

    rank = Rank.COMPARISON
    what: ClassVar[str]

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        assert guard.source is not None
        held = out.held_source(guard.source, int(guard.expected))
        if held is None:
            return f"id({v}) == {int(guard.expected)}"
        return f"{v} is {held} is not None"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        if id(value) == guard.expected:
            return None
        return f"{where} is a different {self.what} (id changed)"

    def implied(self, guard: GuardSpec, others: Sequence[GuardSpec]) -> bool:
        # a MODULE_TREE on the same source tests the same identity; kept, this guard would
        # join the tree's group, and a group holding nothing else (a frame that only calls the
        # module, as a compiled wrapper module's is) would watch the tree and run again each
        # time the stamp moved for nothing
        return any(
            o.kind is GuardKind.MODULE_TREE and id(o.expected) == guard.expected for o in others
        )


@register(GuardKind.ID_MATCH)
class IdMatch(_Identity):
    what = "object"
    stamp_protects = ANY_REACH


@register(GuardKind.CLASS_ATTR)
class ClassAttrKind(Kind):
    """A method (or property, static or class method) the trace inlined is still what its
    class gives for the name. No source: one test per (class, name) for all its instances;
    all of a check's join one expression. Class and value are held strongly, as the class's
    own dict holds them: a lookup through the class's attribute cache costs far less than
    resolving a weak reference."""

    rank = Rank.COMPARISON
    has_source = False
    batched = True

    def accepts(self, expected: Any) -> bool:
        return isinstance(expected, ClassAttr)

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        found: ClassAttr = guard.expected
        owner = out.bind(found.owner, "T")
        value = out.bind(found.value, "fn")
        # a classmethod binds anew on each lookup: equal when class and function are the same
        op = "==" if isinstance(found.value, types.MethodType) else "is"
        return f"getattr({owner}, {found.name!r}, None) {op} {value}"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        found: ClassAttr = guard.expected
        if found.holds():
            return None
        return f"{found.owner.__qualname__}.{found.name} is no longer the one traced (reassigned)"


@register(GuardKind.MODULE_MATCH)
class ModuleMatch(_Identity):
    """An ``nn.Module`` by identity (its training flag is a ``BOOL`` guard of its own)."""

    what = "module"
    stamp_protects = frozenset({"module"})


@register(GuardKind.MODULE_TREE)
class ModuleTree(Kind):
    """The very module, whose guards below it join its group, run only after the module stamp
    moved (:mod:`kiln.guards.module_tree`). ``expected`` is the module (a built check's list
    of guards holds it through a weak reference)."""

    rank = Rank.COMPARISON
    reads_twice = True
    stamp_protects = frozenset({"module"})

    def accepts(self, expected: Any) -> bool:
        return isinstance(expected, torch.nn.Module)

    def known_type(self, expected: Any) -> type | None:
        return type(expected)

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        return f"{v} is {out.held(guard.expected, 'module')} is not None"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        expected = guard.expected
        if isinstance(expected, weakref.ref):
            expected = expected()
        return None if value is expected else f"{where} is a different module object"


@register(GuardKind.HOOKS_EMPTY)
class HooksEmpty(Kind):
    """The module has no forward or pre-hooks, and no global module hooks are registered."""

    rank = Rank.HOOKS
    stamp_protects = frozenset({"module"})

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        dicts = [f"{v}.{name}" for name in hooks.module_hook_names]
        dicts += [out.bind(d, "global_hooks") for d in hooks.global_hook_dicts]
        return "not (" + " or ".join(dicts) + ")"

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        for name in hooks.module_hook_names:
            if getattr(value, name, None):
                return f"{where} has {name.strip('_').replace('_', ' ')} now"
        if any(hooks.global_hook_dicts):
            return "global module hooks are registered now"
        return None
