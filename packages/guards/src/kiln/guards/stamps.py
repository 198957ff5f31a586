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
- the tensor swaps of ``torch.nn.utils._named_member_accessor`` (``torch.func.functional_call``),
- writes straight into a watched module's dicts: its ``__dict__`` (``m.__dict__["alpha"] =
  4.0``), ``_parameters``, ``_buffers`` and ``_modules`` (``m._parameters["w"] = p``), which
  :func:`watch` replaces by dicts of :class:`WatchedDict` holding the same items,
- changes to the metadata of a watched tensor (a parameter or buffer of a watched module)
  through the Python API: ``t.data = u``, ``t.requires_grad = b``, ``requires_grad_``,
  ``detach_``, ``set_``, ``resize_``, ``resize_as_``, ``as_strided_``, ``t_``,
  ``transpose_``, ``swapdims_``, ``swapaxes_``, ``squeeze_``, ``unsqueeze_``,
  ``torch.utils.swap_tensors``, and any ``UntypedStorage.resize_``.

A group watches its tree (:func:`watch`) when its check is built and whenever it passes
after the stamp moved, so modules and tensors added to the tree later are watched too.
What it cannot see: metadata changes that bypass the Python methods above
(``torch.ops.aten.set_(p, u)``, C++ extensions), writes that skip both
``Module.__setattr__`` and the dict's own methods (``object.__setattr__(m, "alpha", 4.0)``),
``p.__class__ = ...`` on a tensor, and modules whose ``__dict__`` is not a plain dict. Call :func:`bump` after such changes, or set
``kiln.guards.config.trust_module_stamps = False`` to run the groups on every call.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from kiln.capture.source import MODULE_STORES

__all__ = [
    "DICT_TYPES",
    "WatchedDict",
    "bump",
    "current",
    "install",
    "installed",
    "state",
    "watch",
    "watched",
]

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


# Tensor methods that change a tensor's sizes, strides, storage, dtype or requires_grad in
# place (every in-place view op of ATen, and the storage swaps).
_TENSOR_METADATA_METHODS = (
    "requires_grad_",
    "detach_",
    "set_",
    "resize_",
    "resize_as_",
    "as_strided_",
    "t_",
    "transpose_",
    "swapdims_",
    "swapaxes_",
    "squeeze_",
    "unsqueeze_",
)
# ids of the parameters and buffers of watched modules (a weak reference each, so an id
# reused by a new tensor is told apart)
_watched_tensors: dict[int, weakref.ref[torch.Tensor]] = {}


def _is_watched(t: Any) -> bool:
    ref = _watched_tensors.get(id(t))
    return ref is not None and ref() is t


def _watch_tensor(t: torch.Tensor) -> None:
    key = id(t)
    ref = _watched_tensors.get(key)
    if ref is None or ref() is not t:
        _watched_tensors[key] = weakref.ref(t, functools.partial(_forget, key))


def _forget(key: int, _: object = None) -> None:
    ref = _watched_tensors.get(key)
    if ref is not None and ref() is None:
        del _watched_tensors[key]


class WatchedDict(dict[Any, Any]):
    """A module's ``__dict__`` or parameter/buffer/submodule dict that moves the stamp when
    written to. Reads are the plain dict's; pickles and copies are plain dicts; capture
    traces it as a plain dict."""

    __kiln_plain_dict__ = True

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        bump()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        bump()

    def __ior__(self, other: Any) -> WatchedDict:  # type: ignore[misc]
        super().__ior__(other)
        bump()
        return self

    def clear(self) -> None:
        super().clear()
        bump()

    def pop(self, *args: Any) -> Any:
        try:
            return super().pop(*args)
        finally:
            bump()

    def popitem(self) -> tuple[Any, Any]:
        try:
            return super().popitem()
        finally:
            bump()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        try:
            return super().setdefault(key, default)
        finally:
            bump()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        bump()

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self),)


#: dict and its watched form: the same type to a guard (watching must not fail a TYPE_MATCH
#: recorded before a module's dicts were swapped, nor one recorded after a plain copy)
DICT_TYPES = (dict, WatchedDict)


def watch(root: torch.nn.Module) -> bool:
    """Make writes behind ``Module.__setattr__`` anywhere in ``root``'s tree move the stamp:
    every module's dicts become :class:`WatchedDict` and every parameter and buffer a
    watched tensor. Returns True (generated checks call it inside a condition)."""
    for m in root.modules():
        state = object.__getattribute__(m, "__dict__")
        if type(state) is dict:
            try:
                object.__setattr__(m, "__dict__", WatchedDict(state))
                state = object.__getattribute__(m, "__dict__")
            except (TypeError, AttributeError):
                pass  # a class that manages its own __dict__: its attributes stay unwatched
        for store in MODULE_STORES:
            table = state.get(store)
            if type(table) is dict:
                dict.__setitem__(state, store, WatchedDict(table))
        for tensors in (state.get("_parameters"), state.get("_buffers")):
            for t in (tensors or {}).values():
                if isinstance(t, torch.Tensor):
                    _watch_tensor(t)
    return True


def watched(obj: Any) -> bool:
    """Whether changes to ``obj`` (a module or a tensor) behind torch's back move the stamp."""
    if isinstance(obj, torch.nn.Module):
        return type(object.__getattribute__(obj, "__dict__")) is WatchedDict
    return _is_watched(obj)


def _bumping_if_watched(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            if _is_watched(self):
                bump()

    wrapper.__kiln_stamp_original__ = method  # type: ignore[attr-defined]
    return wrapper


def _watched_property(name: str) -> property:
    """``torch.Tensor.<name>`` read as before (torch's own C getter), set moving the stamp."""
    descriptor = getattr(torch._C.TensorBase, name)

    def setter(self: torch.Tensor, value: Any) -> None:
        descriptor.__set__(self, value)
        if _is_watched(self):
            bump()

    return property(descriptor.__get__, setter, None, descriptor.__doc__)


def _install_tensor_patches() -> None:
    tensor = torch.Tensor
    for name in ("data", "requires_grad"):
        setattr(tensor, name, _watched_property(name))
    for name in _TENSOR_METADATA_METHODS:
        method = getattr(tensor, name, None)
        if method is not None:
            setattr(tensor, name, _bumping_if_watched(method))
    storage = torch.UntypedStorage
    storage.resize_ = _bumping(storage.resize_)  # type: ignore[method-assign]
    torch.utils.swap_tensors = _bumping(torch.utils.swap_tensors)


def install() -> None:
    """Patch torch so module changes bump the stamp; idempotent."""
    global _installed
    if _installed:
        return
    _install_tensor_patches()
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
