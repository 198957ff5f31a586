"""Guards checked one at a time, with the failure said in words.

The generated check (:mod:`kiln.guards.codegen`) answers "does every guard hold?"
fast; this module answers "which guard fails first, and how?" slowly and plainly,
for recompile logs and ``failure_reason``. Both follow the same order, and each kind's
:meth:`~kiln.guards.kinds.Kind.explain` mirrors the expression its
:meth:`~kiln.guards.kinds.Kind.condition` emits, side by side in :mod:`kiln.guards.kinds`.
"""

from __future__ import annotations

from typing import Any

from kiln.capture.guard_data import GuardSpec
from kiln.capture.source import ClosureSource, GlobalSource, Source, root_of
from kiln.guards.kinds import KINDS

__all__ = ["describe", "explain"]


def describe(source: Source) -> str:
    """How a source is named in messages: globals and closure cells say so."""
    root = root_of(source)
    if isinstance(root, GlobalSource):
        return f"global {source}"
    if isinstance(root, ClosureSource):
        return f"closure {source}"
    return str(source)


def explain(guard: GuardSpec, value: Any, where: str | None = None) -> str | None:
    """Why ``guard`` fails for ``value`` (its source's current value), or None if it holds;
    ``where`` names the source (default: :func:`describe`)."""
    kind = KINDS.get(guard.kind)
    if kind is None:
        return f"unknown guard kind {guard.kind}"
    if where is None:
        where = describe(guard.source) if guard.source is not None else "<global state>"
    return kind.explain(guard, where, value)
