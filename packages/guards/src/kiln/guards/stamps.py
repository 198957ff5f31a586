"""The module stamp: one process-wide number that moves whenever a watched module might have
changed.

A ``MODULE_TREE`` guard's group (:mod:`kiln.guards.module_tree`) remembers the stamp at which
it last passed; while the stamp stays the same, the group is skipped, so checking a module tree
costs one integer comparison however deep the tree is. When the stamp moves, the group runs
once and, if it passes, remembers the new stamp.

The contract with the rest of the process: importing Kiln changes nothing, and nothing moves
the stamp or costs anything extra for modules and tensors Kiln does not watch. A group watches
its tree (:func:`watch`) when its check is built and whenever it passes after the stamp moved;
the first :func:`watch` calls :func:`install`, which patches, once:

- ``nn.Module.__setattr__`` / ``__delattr__``: after torch's own, they move the stamp only for
  a watched module (its ``__dict__`` is a :class:`WatchedDict`); plain attributes, ``train()``
  / ``eval()`` and class swaps go through them;
- ``torch.nn.Parameter`` (the class only, never ``torch.Tensor``): ``data`` and
  ``requires_grad`` become properties whose getters are torch's own C getters, and the
  in-place metadata methods (``requires_grad_``, ``detach_``, ``set_``, ``resize_``,
  ``resize_as_``, ``as_strided_``, ``t_``, ``transpose_``, ``swapdims_``, ``swapaxes_``,
  ``squeeze_``, ``unsqueeze_``) wrappers that move the stamp after torch's own for a watched
  parameter. Plain tensors keep torch's descriptors and methods;
- ``UntypedStorage.resize_``: it moves the stamp when the storage is a watched tensor's.

(``torch.utils.swap_tensors`` refuses a tensor that has weak references, as every watched
tensor does, so it needs no patch.)

Watching a module also replaces its ``__dict__``, ``_parameters``, ``_buffers``, ``_modules``
by :class:`WatchedDict` and its hook dicts (``_forward_hooks``, ...) by :class:`WatchedHooks`
holding the same items, so writes straight into them (``m.__dict__["alpha"] = 4.0``,
``m._parameters["w"] = p``, ``register_buffer``, ``add_module``, every hook registration and
removal, ``functional_call``'s swaps, ``_apply``'s) move the stamp without any process-wide
patch.

The patches see every metadata change of a parameter whose class is ``nn.Parameter`` or a
subclass that overrides none of the patched names (:func:`tracks_metadata`). Buffers (plain
tensors) and any other tensor in ``_parameters`` keep torch's own methods: the check compares
their metadata on every call with what it was when the group last passed (:class:`Untracked`),
and so it does the global module hook dicts (``register_module_forward_hook``); either
differing runs the group.

What it cannot see: changes below Python (``torch.ops.aten.set_(p, u)``, C++ extensions,
``torch.Tensor.set_(p, u)`` and torch's C descriptors called directly on a parameter), writes
that skip both ``Module.__setattr__`` and the dicts' own methods (``object.__setattr__(m,
"alpha", 4.0)``, ``dict.__setitem__(m.__dict__, ...)``), ``p.__class__ = ...`` on a tensor,
and modules whose ``__dict__`` is not a plain dict. Call :func:`bump` after such changes, or
set ``kiln.guards.config.trust_module_stamps = False`` to run the groups on every call.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.source import MODULE_STORES
from kiln.guards import hooks

__all__ = [
    "SAME_TYPES",
    "Untracked",
    "WatchedDict",
    "WatchedParameters",
    "WatchedHooks",
    "bump",
    "bump_tensors",
    "current",
    "install",
    "installed",
    "rewatch",
    "state",
    "structure",
    "tracks_class",
    "tracks_metadata",
    "watch",
    "watched",
]

_counter = itertools.count(1)
state: list[int] = [0]  # generated checks read ``state[0]``; a list keeps one shared cell
# moves with ``state`` on every change but one: a parameter slot's tensor replaced by another
# tensor, or a watched storage resized (FSDP's swaps around every call), after which a group
# re-checks only its tensors (see :class:`WatchedParameters`)
structure: list[int] = [0]
_installed = False
_install_lock = threading.Lock()
# guards the watched-tensor tables, written by groups passing in several threads and by weakref
# callbacks (re-entrant: a callback may run inside an update, on the same thread)
_tables_lock = threading.RLock()


def bump(*_: Any, **__: Any) -> None:
    """Move the stamp: some module may have changed (accepts and ignores any arguments)."""
    structure[0] = state[0] = next(_counter)  # itertools.count is atomic under the GIL


def bump_tensors() -> None:
    """Move the stamp for a change that only tensors' guards can see: a parameter's tensor
    swapped for another tensor, a watched storage resized."""
    state[0] = next(_counter)


def current() -> int:
    """The stamp now."""
    return state[0]


def installed() -> bool:
    """Whether the patches that move the stamp for watched objects are in place."""
    return _installed


class _Bumping:
    """Dict writes that move the stamp after the write (so a check racing with one never
    passes a half-made state); mixed into a dict type."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)  # type: ignore[misc]
        bump()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)  # type: ignore[misc]
        bump()

    def __ior__(self, other: Any) -> Any:
        super().__ior__(other)  # type: ignore[misc]
        bump()
        return self

    def clear(self) -> None:
        super().clear()  # type: ignore[misc]
        bump()

    def pop(self, *args: Any) -> Any:
        try:
            return super().pop(*args)  # type: ignore[misc]
        finally:
            bump()

    def popitem(self, *args: Any) -> Any:
        try:
            return super().popitem(*args)  # type: ignore[misc]
        finally:
            bump()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        try:
            return super().setdefault(key, default)  # type: ignore[misc]
        finally:
            bump()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)  # type: ignore[misc]
        bump()


class WatchedDict(_Bumping, dict[Any, Any]):
    """A module's ``__dict__`` or parameter/buffer/submodule dict that moves the stamp when
    written to. Reads are the plain dict's; pickles and copies are plain dicts; capture
    traces it as a plain dict."""

    __kiln_plain_dict__ = True

    def __setitem__(self, key: Any, value: Any) -> None:
        # _Bumping's, without its super() and bump() calls: FSDP writes each parameter into
        # its module's ``_parameters`` twice per forward and twice per backward
        dict.__setitem__(self, key, value)
        structure[0] = state[0] = next(_counter)

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self),)


class WatchedParameters(WatchedDict):
    """A watched module's ``_parameters``: replacing a tensor by another tensor under a name
    it holds moves the stamp for tensors only (:func:`bump_tensors`), which a group whose
    tensors are all tracked parameters or buffers answers by re-checking just them; every
    other write (a new name, None, a deletion) moves it as any write does."""

    def __setitem__(self, key: Any, value: Any) -> None:
        old = dict.get(self, key)
        dict.__setitem__(self, key, value)
        n = next(_counter)
        if not (isinstance(old, torch.Tensor) and isinstance(value, torch.Tensor)):
            structure[0] = n
        state[0] = n


class WatchedHooks(_Bumping, collections.OrderedDict[Any, Any]):
    """A watched module's hook dict (``_forward_hooks``, ...): registering or removing a hook
    moves the stamp. Pickles and copies as an ``OrderedDict``; capture traces it as one."""

    __kiln_plain_dict__ = True

    def __reduce__(self) -> tuple[Any, ...]:
        return collections.OrderedDict, (list(self.items()),)


#: each watched form and the plain type it stands for: the same type to a guard (watching must
#: not fail a TYPE_MATCH recorded before a module's dicts were swapped, nor one recorded after
#: a plain copy)
_DICTS = (dict, WatchedDict, WatchedParameters)
SAME_TYPES: dict[type, tuple[type, ...]] = {
    dict: _DICTS,
    WatchedDict: _DICTS,
    WatchedParameters: _DICTS,
    collections.OrderedDict: (collections.OrderedDict, WatchedHooks),
    WatchedHooks: (collections.OrderedDict, WatchedHooks),
}

# Parameter methods that change a tensor's sizes, strides, storage or requires_grad in place
# (every in-place view op of ATen, and the storage swaps).
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
_PARAMETER_PATCHES = ("data", "requires_grad", *_TENSOR_METADATA_METHODS)

# id of each watched parameter or buffer -> (a weak reference, so an id reused by a new tensor
# is told apart; the key of its storage when it was watched)
_watched_tensors: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
# storage key -> how many watched tensors were on that storage when watched
_watched_storages: collections.Counter[int] = collections.Counter()
_tracked_types: dict[type, bool] = {}


def _storage_key(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return 0  # no storage of its own (sparse, some wrapper subclasses)


def _is_watched(t: Any) -> bool:
    entry = _watched_tensors.get(id(t))
    return entry is not None and entry[0]() is t


def _drop_storage(key: int) -> None:
    _watched_storages[key] -= 1
    if _watched_storages[key] <= 0:
        del _watched_storages[key]


def _watch_tensor(t: torch.Tensor) -> None:
    key = id(t)
    storage = _storage_key(t)
    entry = _watched_tensors.get(key)  # a dict read needs no lock under the GIL
    if entry is not None and entry[1] == storage and entry[0]() is t:
        return  # watched already, on this storage: every call of a tree watched again
    with _tables_lock:
        entry = _watched_tensors.get(key)
        if entry is not None:
            if entry[0]() is t and entry[1] == storage:
                return
            _drop_storage(entry[1])  # an older storage, or a dead tensor that had this id
        ref = entry[0] if entry is not None and entry[0]() is t else None
        if ref is None:
            ref = weakref.ref(t, functools.partial(_forget, key))
        _watched_tensors[key] = (ref, storage)
        _watched_storages[storage] += 1


def _forget(key: int, ref: object) -> None:
    with _tables_lock:
        entry = _watched_tensors.get(key)
        if entry is not None and entry[0] is ref:
            del _watched_tensors[key]
            _drop_storage(entry[1])


def tracks_metadata(t: Any) -> bool:
    """Whether every metadata change of ``t`` through torch's Python API would move the stamp
    once ``t`` is watched: ``t`` is an ``nn.Parameter`` whose class overrides none of the
    patched attributes. Other tensors' metadata must be checked on every call."""
    return tracks_class(type(t))


def tracks_class(cls: type) -> bool:
    """:func:`tracks_metadata` of a tensor of class ``cls``."""
    known = _tracked_types.get(cls)
    if known is None:
        parameter = torch.nn.Parameter
        below = cls.__mro__[: cls.__mro__.index(parameter)] if issubclass(cls, parameter) else None
        known = below is not None and not any(
            name in vars(c) for c in below for name in _PARAMETER_PATCHES
        )
        _tracked_types[cls] = known
    return known


def watch(root: torch.nn.Module, untracked: Untracked | None = None) -> bool:
    """Make writes behind ``Module.__setattr__`` anywhere in ``root``'s tree move the stamp:
    every module's dicts become :class:`WatchedDict`, its hook dicts :class:`WatchedHooks`,
    and every parameter and buffer a watched tensor; then record the metadata of the tensors
    the stamp cannot follow in ``untracked``. Installs the patches on first use. Returns True
    (generated checks call it inside a condition).

    One walk does it all: a group runs it each time it passes after the stamp moved (every
    call of a module whose parameters FSDP swaps), so the walk is written for a tree that is
    watched already: a dict read and a type test per store, a table read per tensor."""
    install()
    found: dict[int, torch.Tensor] = {}  # the tensors the stamp cannot follow
    tensors = _watched_tensors
    tracked = _tracked_types
    modules = [root]
    seen = {id(root)}
    for m in modules:  # grows while it is walked: breadth first
        table = object.__getattribute__(m, "__dict__")
        if type(table) is dict:
            try:
                object.__setattr__(m, "__dict__", WatchedDict(table))
                table = object.__getattribute__(m, "__dict__")
            except (TypeError, AttributeError):
                pass  # a class that manages its own __dict__: its attributes stay unwatched
        for store, plain, watched_type in _STORES:
            held = table.get(store)
            if type(held) is plain:
                dict.__setitem__(table, store, watched_type(held))
        for store, follows in (("_parameters", True), ("_buffers", False)):
            held = table.get(store)
            for t in (held or _EMPTY).values():
                if not isinstance(t, torch.Tensor):
                    continue
                entry = tensors.get(id(t))
                if entry is None or entry[0]() is not t or entry[1] != _storage_key(t):
                    _watch_tensor(t)
                if not (follows and (tracked.get(type(t)) or tracks_metadata(t))):
                    found[id(t)] = t
        below = table.get("_modules")
        for sub in (below or _EMPTY).values():
            if sub is not None and id(sub) not in seen:
                seen.add(id(sub))
                modules.append(sub)
    if untracked is not None:
        untracked.entries = tuple((weakref.ref(t), _metadata(t)) for t in found.values())
    return True


_EMPTY: dict[Any, Any] = {}
# each dict a watched module holds, its plain type and the watched type that replaces it
_STORES: tuple[tuple[str, type, type], ...] = (
    *(
        (name, dict, WatchedParameters if name == "_parameters" else WatchedDict)
        for name in MODULE_STORES
    ),
    *((name, collections.OrderedDict, WatchedHooks) for name in hooks.module_hook_names),
)


def _tree(root: torch.nn.Module) -> list[torch.nn.Module]:
    """``root`` and every module below it, each once: ``root.modules()`` without its
    generators and names."""
    found = [root]
    seen = {id(root)}
    for m in found:  # grows while it is walked: breadth first
        below = object.__getattribute__(m, "__dict__").get("_modules")
        for sub in (below or {}).values():
            if sub is not None and id(sub) not in seen:
                seen.add(id(sub))
                found.append(sub)
    return found


def _metadata(t: torch.Tensor) -> object:
    try:
        shape = (t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad)
        bits = (t.is_conj(), t.is_neg())
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return object()  # nothing to compare: counts as changed on every call
    try:
        storage: object = t.data_ptr()  # another storage (``.data = u`` with the same sizes)
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        storage = None
    if hasattr(t, "__tensor_flatten__"):
        # a wrapper subclass (a DTensor parameter) has no storage of its own (its data_ptr is
        # 0, or raises): its inner tensors' metadata stand for it
        return (*shape, *bits, storage, _inner_metadata(t))
    return (*shape, *bits, storage) if storage is not None else object()


def _inner_metadata(t: torch.Tensor) -> object:
    """A traceable wrapper subclass's class, flatten context and inner tensors' metadata;
    an object equal to nothing where it has none to give."""
    try:
        names, context = t.__tensor_flatten__()  # type: ignore[attr-defined]
        hash(context)  # compared by ==: a context that cannot be is never the same
        inner = tuple(_metadata(getattr(t, name)) for name in names)
    except Exception:  # a subclass's own code: unknown, so changed
        return object()
    return (type(t), context, inner)


class Untracked:
    """The metadata of the tensors in a tree whose changes the stamp cannot see (buffers,
    and anything in ``_parameters`` that is not a tracked ``nn.Parameter``), as it was
    when the tree's group last passed. A check compares it on every call: a buffer's
    ``.data =``, ``.requires_grad =`` or in-place view op then runs the group again."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: tuple[tuple[weakref.ref[torch.Tensor], object], ...] = ()

    def take(self, root: torch.nn.Module) -> None:
        self.take_from(_tree(root))

    def take_from(self, modules: list[torch.nn.Module]) -> None:
        found: dict[int, torch.Tensor] = {}
        for m in modules:
            table = object.__getattribute__(m, "__dict__")
            for t in (table.get("_buffers") or {}).values():
                if isinstance(t, torch.Tensor):
                    found[id(t)] = t
            for t in (table.get("_parameters") or {}).values():
                if isinstance(t, torch.Tensor) and not tracks_metadata(t):
                    found[id(t)] = t
        self.entries = tuple((weakref.ref(t), _metadata(t)) for t in found.values())

    def unchanged(self) -> bool:
        for ref, meta in self.entries:
            t = ref()
            if t is None or _metadata(t) != meta:
                return False
        return True


def watched(obj: Any) -> bool:
    """Whether changes to ``obj`` (a module or a tensor) behind torch's back move the stamp."""
    if isinstance(obj, torch.nn.Module):
        return type(object.__getattribute__(obj, "__dict__")) is WatchedDict
    return _is_watched(obj)


# --- the patches: each acts after torch's own code, and only for what is watched ----------

_module_setattr: Callable[..., None] = torch.nn.Module.__setattr__
_module_delattr: Callable[..., None] = torch.nn.Module.__delattr__
_storage_resize: Callable[..., Any] = torch.UntypedStorage.resize_


def _setattr_watching(self: torch.nn.Module, name: str, value: Any) -> None:
    try:
        _module_setattr(self, name, value)
    finally:
        if type(self.__dict__) is WatchedDict:
            bump()


def _delattr_watching(self: torch.nn.Module, name: str) -> None:
    try:
        _module_delattr(self, name)
    finally:
        if type(self.__dict__) is WatchedDict:
            bump()


def _resize_watching(self: torch.UntypedStorage, size: int) -> Any:
    try:
        return _storage_resize(self, size)
    finally:
        if _watched_storages and self._cdata in _watched_storages:
            bump_tensors()  # a tensor guard's storage test sees it; buffers' records too


def rewatch(tensors: tuple[torch.Tensor, ...]) -> bool:
    """Watch each of ``tensors`` (on its storage now) that is not: a group that re-checked only
    its tensors after :func:`bump_tensors` calls it on them. Returns True."""
    found = _watched_tensors
    for t in tensors:
        entry = found.get(id(t))
        if entry is None or entry[1] != _storage_key(t) or entry[0]() is not t:
            _watch_tensor(t)
    return True


def _bumping_if_watched(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            if _is_watched(self):
                _watch_tensor(self)  # ``set_`` may have moved it to another storage
                bump()

    wrapper.__kiln_stamp_original__ = method  # type: ignore[attr-defined]
    return wrapper


def _watched_property(name: str) -> property:
    """``<tensor>.<name>`` read through torch's own C getter, set moving the stamp when the
    tensor is watched."""
    descriptor = getattr(torch._C.TensorBase, name)

    def setter(self: torch.Tensor, value: Any) -> None:
        descriptor.__set__(self, value)
        if _is_watched(self):
            _watch_tensor(self)  # ``.data =`` moves it to another storage
            bump()

    return property(descriptor.__get__, setter, None, descriptor.__doc__)


def install() -> None:
    """Patch torch so changes to watched modules and parameters move the stamp; idempotent.
    Called by the first :func:`watch`, never at import."""
    global _installed, _module_setattr, _module_delattr, _storage_resize
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        parameter = torch.nn.Parameter
        for name in ("data", "requires_grad"):
            setattr(parameter, name, _watched_property(name))
        for name in _TENSOR_METADATA_METHODS:
            method = getattr(parameter, name, None)
            if method is not None:
                setattr(parameter, name, _bumping_if_watched(method))
        module = torch.nn.Module
        _module_setattr, _module_delattr = module.__setattr__, module.__delattr__
        module.__setattr__ = functools.wraps(_module_setattr)(_setattr_watching)  # type: ignore[method-assign]
        module.__delattr__ = functools.wraps(_module_delattr)(_delattr_watching)  # type: ignore[method-assign]
        storage = torch.UntypedStorage
        _storage_resize = storage.resize_
        storage.resize_ = functools.wraps(_storage_resize)(_resize_watching)  # type: ignore[method-assign,assignment]
        _installed = True
    bump()
