"""One guard for a whole nn.Module subtree: a snapshot, a walk, and its O(1) fast path.

A :class:`TreeSnapshot` records, for every module under a root, what a captured graph
may have baked in: the module objects, their classes and training flags, parameters
and buffers (by identity and by tensor metadata, so in-place value updates such as an
optimizer step pass while replacements, ``.half()`` or ``.to()`` fail), plain
attributes (constants by value, other objects by identity) and hook registrations.
:meth:`TreeSnapshot.check` is what generated guards call: one comparison of the
module stamp while nothing changed, one full walk when the stamp moved.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kiln.capture.guard_data import TensorMeta
from kiln.guards import hooks, stamps
from kiln.guards.config import config

__all__ = ["TreeSnapshot", "explain", "reach", "snapshot"]

_HOOK_DICTS = frozenset(
    {
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks_with_kwargs",
    }
)
_STRUCTURAL = frozenset({"_parameters", "_buffers", "_modules", "training"})
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


class _Compare(enum.Enum):
    VALUE = "value"  # constants: same type and ==
    IDENTITY = "identity"  # other objects: the same object
    KEYS = "keys"  # hook dicts: the same registrations


@dataclasses.dataclass(frozen=True)
class _Attr:
    name: str
    how: _Compare
    expected: Any


@dataclasses.dataclass(frozen=True)
class _Tensor:
    name: str
    tensor: torch.Tensor | None
    meta: TensorMeta | None


@dataclasses.dataclass(frozen=True)
class _ModuleRecord:
    path: str
    module: torch.nn.Module
    cls: type
    training: bool
    attrs: tuple[_Attr, ...]
    params: tuple[_Tensor, ...]
    buffers: tuple[_Tensor, ...]
    children: tuple[tuple[str, torch.nn.Module | None], ...]
    quick: _Quick


def _getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``d -> tuple(d[n] for n in names)``, in C where possible (KeyError when one is missing)."""
    if not names:
        return lambda d: ()
    if len(names) == 1:
        name = names[0]
        return lambda d: (d[name],)
    return operator.itemgetter(*names)


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, t.device, t.requires_grad, t.shape, t.stride())


@dataclasses.dataclass(frozen=True)
class _Tensors:
    """Parameters or buffers of one module, laid out for a quick all-at-once comparison."""

    names: tuple[str, ...]
    objects: tuple[torch.Tensor | None, ...]
    keys: tuple[tuple[Any, ...] | None, ...]

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor | None]) -> _Tensors:
        objects = tuple(tensors.values())
        keys = tuple(None if t is None else _tensor_key(t) for t in objects)
        return cls(tuple(tensors), objects, keys)

    def match(self, got: dict[str, Any]) -> bool:
        if tuple(got) != self.names or not all(map(operator.is_, got.values(), self.objects)):
            return False
        return all(
            t is None or _tensor_key(t) == k for t, k in zip(self.objects, self.keys, strict=True)
        )


@dataclasses.dataclass(frozen=True)
class _Quick:
    """One module's record compiled for a yes/no answer; reasons come from the slow walk."""

    n_state: int
    identity_get: Callable[[dict[str, Any]], tuple[Any, ...]]
    identity: tuple[Any, ...]
    value_get: Callable[[dict[str, Any]], tuple[Any, ...]]
    values: tuple[Any, ...]
    value_types: tuple[type, ...]
    hooks_get: Callable[[dict[str, Any]], tuple[Any, ...]]
    hook_keys: tuple[tuple[Any, ...], ...]
    params: _Tensors
    buffers: _Tensors
    child_names: tuple[str, ...]
    children: tuple[torch.nn.Module | None, ...]

    @classmethod
    def of(cls, module: torch.nn.Module, attrs: tuple[_Attr, ...]) -> _Quick:
        by = {how: tuple(a for a in attrs if a.how is how) for how in _Compare}
        values = tuple(a.expected for a in by[_Compare.VALUE])
        return cls(
            len(vars(module)),
            _getter(tuple(a.name for a in by[_Compare.IDENTITY])),
            tuple(a.expected for a in by[_Compare.IDENTITY]),
            _getter(tuple(a.name for a in by[_Compare.VALUE])),
            values,
            tuple(map(type, values)),
            _getter(tuple(a.name for a in by[_Compare.KEYS])),
            tuple(a.expected for a in by[_Compare.KEYS]),
            _Tensors.of(module._parameters),
            _Tensors.of(module._buffers),
            tuple(module._modules),
            tuple(module._modules.values()),
        )

    def match(self, m: torch.nn.Module) -> bool:
        state = vars(m)
        if len(state) != self.n_state:
            return False
        try:
            if not all(map(operator.is_, self.identity_get(state), self.identity)):
                return False
            got = self.value_get(state)
            if tuple(map(type, got)) != self.value_types or got != self.values:
                return False
            if tuple(map(tuple, self.hooks_get(state))) != self.hook_keys:
                return False
        except (KeyError, TypeError):
            return False
        modules = m._modules
        return (
            self.params.match(m._parameters)
            and self.buffers.match(m._buffers)
            and tuple(modules) == self.child_names
            and all(map(operator.is_, modules.values(), self.children))
        )


def _is_constant(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_constant(v) for v in value)
    return type(value) in _CONSTANT_TYPES


def _record_attr(name: str, value: Any) -> _Attr:
    if name in _HOOK_DICTS and isinstance(value, dict):
        return _Attr(name, _Compare.KEYS, tuple(value))
    if _is_constant(value):
        return _Attr(name, _Compare.VALUE, value)
    return _Attr(name, _Compare.IDENTITY, value)


def _record_tensors(tensors: Mapping[str, torch.Tensor | None]) -> tuple[_Tensor, ...]:
    return tuple(
        _Tensor(name, t, TensorMeta.of(t) if t is not None else None) for name, t in tensors.items()
    )


def _child_path(path: str, name: str) -> str:
    return f"{path}[{name}]" if name.isdigit() else f"{path}.{name}"


def _record(path: str, module: torch.nn.Module) -> _ModuleRecord:
    attrs = tuple(_record_attr(k, v) for k, v in vars(module).items() if k not in _STRUCTURAL)
    return _ModuleRecord(
        path,
        module,
        type(module),
        module.training,
        attrs,
        _record_tensors(module._parameters),
        _record_tensors(module._buffers),
        tuple(module._modules.items()),
        _Quick.of(module, attrs),
    )


def _explain_attr(path: str, module: torch.nn.Module, attr: _Attr) -> str | None:
    state = vars(module)
    if attr.name not in state:
        return f"{path} lost attribute {attr.name!r}"
    got = state[attr.name]
    if attr.how is _Compare.KEYS:
        ok = isinstance(got, dict) and tuple(got) == attr.expected
        return None if ok else f"{path} {attr.name.strip('_').replace('_', ' ')} changed"
    if attr.how is _Compare.VALUE:
        ok = type(got) is type(attr.expected) and (got is attr.expected or got == attr.expected)
        return (
            None if ok else f"{path}.{attr.name} changed: expected {attr.expected!r}, got {got!r}"
        )
    return None if got is attr.expected else f"{path}.{attr.name} was replaced by another object"


def _explain_tensors(
    path: str, kind: str, got: dict[str, Any], want: tuple[_Tensor, ...]
) -> str | None:
    if tuple(got) != tuple(t.name for t in want):
        return f"{path} {kind}s changed: expected {[t.name for t in want]}, got {list(got)}"
    for t in want:
        where = _child_path(path, t.name)
        value = got[t.name]
        if value is not t.tensor:
            return f"{kind} {where} was replaced by another object"
        if t.meta is None or value is None:
            continue
        if (
            value.dtype != t.meta.dtype
            or value.device != t.meta.device
            or value.requires_grad != t.meta.requires_grad
            or tuple(value.shape) != t.meta.sizes
            or tuple(value.stride()) != t.meta.strides
        ):
            return (
                f"{kind} {where} metadata changed: expected {_meta_text(t.meta)}, "
                f"got {_meta_text(TensorMeta.of(value))}"
            )
    return None


def _meta_text(m: TensorMeta) -> str:
    grad = ", requires_grad" if m.requires_grad else ""
    return f"{m.dtype} {list(m.sizes)} stride {list(m.strides)} on {m.device}{grad}"


def _explain_record(rec: _ModuleRecord) -> str | None:
    m = rec.module
    if type(m) is not rec.cls:
        return (
            f"{rec.path} class changed: expected {rec.cls.__qualname__}, got {type(m).__qualname__}"
        )
    if m.training is not rec.training:
        return f"{rec.path}.training changed: expected {rec.training}, got {m.training}"
    state = vars(m)
    expected_names = {a.name for a in rec.attrs}
    for name in state:
        if name not in expected_names and name not in _STRUCTURAL:
            return f"{rec.path} gained attribute {name!r}"
    for attr in rec.attrs:
        reason = _explain_attr(rec.path, m, attr)
        if reason is not None:
            return reason
    reason = _explain_tensors(rec.path, "parameter", m._parameters, rec.params)
    if reason is None:
        reason = _explain_tensors(rec.path, "buffer", m._buffers, rec.buffers)
    if reason is not None:
        return reason
    got_children = m._modules
    if tuple(got_children) != tuple(name for name, _ in rec.children):
        return f"{rec.path} submodules changed: expected {[n for n, _ in rec.children]}, got {list(got_children)}"
    for name, child in rec.children:
        if got_children[name] is not child:
            return f"module {_child_path(rec.path, name)} was replaced by another object"
    return None


class TreeSnapshot:
    """What a module subtree looked like when a check was built, and the stamp it was seen at."""

    def __init__(self, root_path: str, root: torch.nn.Module) -> None:
        stamps.install()
        self.root = root
        self.records: list[_ModuleRecord] = []
        seen: set[int] = set()
        pending = [(root_path, root)]
        while pending:
            path, module = pending.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            rec = _record(path, module)
            self.records.append(rec)
            pending.extend(
                (_child_path(path, n), c) for n, c in reversed(rec.children) if c is not None
            )
        self.global_hooks = hooks.global_hook_keys()
        # validated[0] is the stamp at which the tree last matched; -1 never equals a stamp.
        self.validated: list[int] = [stamps.current()]

    def explain(self, value: Any) -> str | None:
        """The first difference between ``value``'s tree and this snapshot, or None."""
        if value is not self.root:
            return f"{self.records[0].path} is a different module object"
        if hooks.global_hook_keys() != self.global_hooks:
            return "global module hooks changed"
        for rec in self.records:
            reason = _explain_record(rec)
            if reason is not None:
                return reason
        return None

    def check(self, value: Any) -> bool:
        """The slow path of generated checks: walk, and remember the stamp if it matched."""
        stamp = stamps.current()
        if value is not self.root or hooks.global_hook_keys() != self.global_hooks:
            return False
        for rec in self.records:
            m = rec.module
            if type(m) is not rec.cls or m.training is not rec.training or not rec.quick.match(m):
                return False
        self.validated[0] = stamp if config.trust_module_stamps else -1
        return True


_CONTAINER_GETITEMS = frozenset(
    {
        torch.nn.ModuleList.__getitem__,
        torch.nn.Sequential.__getitem__,
        torch.nn.ModuleDict.__getitem__,
    }
)


def _reach_attr(m: torch.nn.Module, name: str) -> tuple[str, Any] | None:
    if name == "training":
        return "value", m.training
    if name in _STRUCTURAL or name in _HOOK_DICTS:
        return None
    if any(name in vars(cls) for cls in type(m).__mro__):
        return None  # a class attribute, property or method: not part of the snapshot
    state = vars(m)
    if name in state:
        value = state[name]
        return ("value" if _is_constant(value) else "identity"), value
    for table, how in ((m._parameters, "tensor"), (m._buffers, "tensor"), (m._modules, "module")):
        if name in table:
            value = table[name]
            return (how if value is not None else "value"), value
    return None


def reach(tree: TreeSnapshot, steps: list[tuple[str, Any]]) -> tuple[str, Any] | None:
    """What the snapshot pins at ``root.<steps>``, if it pins it, as (how, value now).

    ``steps`` are ("attr", name) or ("item", key) from the root. ``how`` is "module"
    (identity and everything under it), "tensor" (identity and metadata), "value"
    (type and ==) or "identity" (the same object; its contents are not covered).
    """
    how, value = "module", tree.root
    for kind, key in steps:
        if how != "module":
            return None
        m: torch.nn.Module = value
        if kind == "attr":
            found = _reach_attr(m, key)
            if found is None:
                return None
            how, value = found
            continue
        getitem = getattr(type(m), "__getitem__", None)
        if getitem not in _CONTAINER_GETITEMS:
            return None
        try:
            value = getitem(m, key)
        except Exception:
            return None
        if not any(value is child for child in m._modules.values()):
            return None  # e.g. a slice of a Sequential: a new module
    return how, value


def snapshot(root_path: str, root: torch.nn.Module) -> TreeSnapshot:
    """Snapshot ``root``'s subtree; ``root_path`` names it in messages (``L['self']``)."""
    return TreeSnapshot(root_path, root)


def explain(where: str, value: Any, expected: TreeSnapshot) -> str | None:
    """Why ``value`` no longer matches the snapshot ``expected`` (``where`` is unused: the
    snapshot names its modules by the paths it was built with)."""
    del where
    return expected.explain(value)
