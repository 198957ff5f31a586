"""Which guards under a module the module stamp protects (the ``MODULE_TREE`` kind).

``GuardSpec(S, MODULE_TREE, module)`` says: ``S`` is this very module, and the guards
capture recorded on values *reached from it through module state* (submodules,
parameters, buffers, attributes set on modules, ``training``, hooks) can only start
failing after something moved the module stamp (:mod:`kiln.guards.stamps`). Those
guards form the tree's group: the generated check runs them only when the stamp
moved since they last passed, so a tree of any depth costs one identity test and one
integer comparison per call while nothing changed.

Guards stay out of the group (and run every call) when the stamp cannot see their
value change: the contents of plain objects and containers held by modules
(``self.cfg.hidden``, ``len(self.sizes)``), class attributes and properties. Which
kinds of guard the stamp protects on a value reached one way or another (see
:func:`reach`) each kind declares (``Kind.stamp_protects`` in :mod:`kiln.guards.kinds`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import torch

from kiln.capture.source import MODULE_STORES

__all__ = ["reach"]

_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
_CONTAINER_GETITEMS = frozenset(
    {
        torch.nn.ModuleList.__getitem__,
        torch.nn.Sequential.__getitem__,
        torch.nn.ModuleDict.__getitem__,
    }
)


def _is_constant(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_constant(v) for v in value)
    return type(value) in _CONSTANT_TYPES


def _reach_attr(m: torch.nn.Module, name: str) -> tuple[str, Any] | None:
    if name == "training":
        return "value", m.training
    if name in MODULE_STORES or name.endswith("_hooks"):
        return None
    if any(name in vars(cls) for cls in type(m).__mro__):
        return None  # a class attribute, property or method: the stamp does not see it
    state = vars(m)
    if name in state:
        value = state[name]
        return ("value" if _is_constant(value) else "object"), value
    for table, how in ((m._parameters, "tensor"), (m._buffers, "tensor"), (m._modules, "module")):
        if name in table:
            value = table[name]
            return (how if value is not None else "value"), value
    return None


def _reach_stored(m: torch.nn.Module, store: str, key: Any) -> tuple[str, Any] | None:
    """``m._parameters[key]`` (or ``_buffers``, ``_modules``): how capture reads module state."""
    table = vars(m).get(store)
    if not isinstance(table, dict) or key not in table:
        return None
    value = table[key]
    if value is None:
        return "value", None
    return ("module" if store == "_modules" else "tensor"), value


def reach(root: torch.nn.Module, steps: Sequence[tuple[str, Any]]) -> tuple[str, Any] | None:
    """How the value at ``root.<steps>`` hangs off module state, and its value now.

    ``steps`` are ("attr", name) or ("item", key); an attribute naming one of the module's
    dicts (``_parameters``, ``_buffers``, ``_modules``) followed by an item is one step
    into that dict (the dict itself is not protected). The answer is "module", "tensor"
    (a parameter or buffer), "value" (a constant attribute, or an empty slot) or
    "object" (another object set on a module: its identity is protected, its
    contents are not); None when some step leaves module state.
    """
    how: str = "module"
    value: Any = root
    store: str | None = None  # the module dict the previous step named
    for kind, key in steps:
        if store is not None:
            found = _reach_stored(value, store, key) if kind == "item" else None
            if found is None:
                return None
            (how, value), store = found, None
            continue
        if how != "module":
            return None
        if kind == "attr" and key in MODULE_STORES:
            store = key
            continue
        if kind == "attr":
            found = _reach_attr(value, key)
            if found is None:
                return None
            how, value = found
            continue
        getitem = getattr(type(value), "__getitem__", None)
        if getitem not in _CONTAINER_GETITEMS:
            return None
        try:
            item = getitem(value, key)
        except Exception:
            return None
        if not any(map(operator.is_, itertools.repeat(item), value._modules.values())):
            return None  # e.g. a slice of a Sequential: a new module each time
        value = item
    if store is not None:
        return None
    return how, value
