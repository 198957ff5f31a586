"""The module stamp: one process-wide number that changes whenever any nn.Module might have.

A ``MODULE_TREE`` guard's group (:mod:`kiln.guards.module_tree`) remembers the stamp
at which it last passed; while the stamp stays the same, the group is skipped, so
checking a module tree costs one integer comparison however deep the tree is. When
the stamp moves, the group runs once and, if it passes, remembers the new stamp.

What bumps the stamp (installed on first use by :func:`install`, narrowly):
- ``nn.Module.__setattr__`` / ``__delattr__`` (attributes, submodules, parameters,
  buffers, ``train()``/``eval()``, class swaps),
- torch's global parameter/buffer/module registration hooks (``register_parameter``,
  ``register_buffer``, ``add_module`` write their dicts directly),
- ``nn.Module._apply`` (``.to()``, ``.half()``, ``.cuda()`` change parameters in place)
  and ``nn.Module.requires_grad_``,
- creating or removing any ``torch.utils.hooks.RemovableHandle`` (every hook registration),
- the tensor swaps of ``torch.nn.utils._named_member_accessor`` (``torch.func.functional_call``).

What it cannot see: writes that bypass those paths, e.g. ``param.data = t``,
``param.requires_grad = False`` or ``param.requires_grad_()`` on one parameter,
``module.__dict__[...] = v``. Call :func:`bump` after such changes, or set
``kiln.guards.config.trust_module_stamps = False`` to run the groups on every call.
"""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["bump", "current", "install", "installed", "state"]

_counter = itertools.count(1)
state: list[int] = [0]  # generated checks read ``state[0]``; a list keeps one shared cell
_installed = False


def bump(*_: Any, **__: Any) -> None:
    """Move the stamp: some module may have changed (accepts and ignores any arguments)."""
    state[0] = next(_counter)  # itertools.count is atomic under the GIL


def current() -> int:
    """The stamp now."""
    return state[0]


def installed() -> bool:
    """Whether the patches that bump the stamp are in place."""
    return _installed


def _bumping(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        finally:
            bump()  # after the change, so a check racing with it cannot pass a half-made state

    wrapper.__kiln_stamp_original__ = method  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Patch torch so module changes bump the stamp; idempotent."""
    global _installed
    if _installed:
        return
    module_cls = torch.nn.Module
    for name in ("__setattr__", "__delattr__", "_apply", "requires_grad_"):
        setattr(module_cls, name, _bumping(getattr(module_cls, name)))
    for name in ("__init__", "remove"):
        setattr(RemovableHandle, name, _bumping(getattr(RemovableHandle, name)))
    # torch.func.functional_call and friends swap tensors straight into ``_parameters``.
    accessor = importlib.import_module("torch.nn.utils._named_member_accessor")
    for name in ("set_tensor", "swap_tensor", "swap_submodule"):
        if hasattr(accessor, name):
            setattr(accessor, name, _bumping(getattr(accessor, name)))
    registration = torch.nn.modules.module
    for name in (
        "register_module_parameter_registration_hook",
        "register_module_buffer_registration_hook",
        "register_module_module_registration_hook",
    ):
        register = getattr(registration, name, None)
        if register is not None:
            register(bump)
    _installed = True
    bump()
