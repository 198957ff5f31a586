"""Reusing the result of an op run on meta tensors for a repeated op on the same metadata.

With symbolic sizes an op runs as Python (a meta kernel, a decomposition, torch's Python
dispatcher), which costs a thousand times its C++ kernel: a transformer's layers repeat the
same ops on the same symbolic shapes, and autograd_aot traces every op capture ran once more.
What such a run gives a functional op's fresh result depends only on the op, its arguments'
metadata (dtype, symbolic sizes, strides and offset) and its other arguments, never on data
(meta tensors have none): so the env remembers the layout each (op, metadata) gave, and a
repeat makes a fresh tensor of that layout (``empty_strided``) instead of running the op again.

The guards a run records are in the env already when it repeats (the same questions about the
same expressions get the same answers from the same hints), and expressions in a key are the
env's simplified ones, so a key made before a guard established ``s1 == s0`` and one made after
name the same sizes alike. Only what a repeat would surely give alike is kept: ops of the aten
and prims namespaces whose schema says they neither alias nor mutate an argument and whose
results do not depend on data, returning tensors only (a random op qualifies: on meta tensors
it draws nothing, and attention's layouts do not depend on its dropout); each result on
the meta device, a fresh strided tensor (not a view, offset 0, its storage no argument's nor
another result's) with every size known at the hint, so no data-dependent (unbacked) symbol
is ever reused for a new value; and every argument one of the kinds the key names exactly.
An argument that requires grad (a parameter) is keyed only while grad mode is off, where the
op's result is the same as for one that does not: with grad mode on it would carry autograd
history, which a remade tensor lacks.

Static sizes get the same treatment: torch's meta kernels are mostly Python for them too (an
elementwise op's ref costs a quarter millisecond, a layer norm's a few), and a key of plain
numbers means the same in every capture, so those runs share one table for the process, and
a later process with the same torch and Kiln may start from it (:func:`static_entries`,
:func:`add_static`: the frontend keeps it beside its whole-graph cache), running no meta
kernel for an op an earlier process ran.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["add_static", "enabled", "recall", "remember", "static_entries"]

_aten = torch.ops.aten

#: Switched off by tests comparing a compile with and without the memo.
enabled = [True]

_NAMESPACES = frozenset({"aten", "prims"})
_SKIP_TAGS = frozenset(
    {
        torch.Tag.dynamic_output_shape,
        torch.Tag.data_dependent_output,
        torch.Tag.inplace_view,
    }
)
# argument values keyed by type and value (``True``, ``1`` and ``1.0`` are distinct keys)
_PLAIN = (int, bool, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyable(Exception):
    """An argument the key cannot name exactly: the op runs without the memo."""


@functools.cache
def _memoizable(func: Any) -> bool:
    """Whether ``func`` returns fresh tensors or views of its arguments only and mutates none
    (by its schema)."""
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "namespace", None) not in _NAMESPACES:
        return False
    if any(tag in _SKIP_TAGS for tag in getattr(func, "tags", ())):
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    returns = schema.returns
    return bool(returns) and all(
        (r.alias_info is None or not r.alias_info.is_write)
        and (
            isinstance(r.type, torch.TensorType)
            or (
                isinstance(r.type, torch.ListType)
                and isinstance(r.type.getElementType(), torch.TensorType)
            )
        )
        for r in returns
    )


def _size_key(s: Any, envs: list[Any]) -> Any:
    if isinstance(s, torch.SymInt):
        node = s.node
        env = getattr(node, "env", None)
        if env is None or node.hint is None:  # not Kiln's node, or data-dependent
            raise _Unkeyable
        if not envs:
            envs.append(env)
        elif envs[0] is not env:
            raise _Unkeyable
        return (torch.SymInt, node.expr)
    return s  # a plain int


def _key(a: Any, envs: list[Any]) -> Any:
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        if (
            a.device.type != "meta"
            or a.layout != torch.strided
            or (a.requires_grad and torch.is_grad_enabled())
            or a.is_conj()
            or a.is_neg()
            or type(a) is not torch.Tensor
        ):
            raise _Unkeyable
        if not a._has_symbolic_sizes_strides:  # every size, stride and offset a plain int
            return (torch.Tensor, a.dtype, tuple(a.shape), a.stride(), a.storage_offset())
        return (
            torch.Tensor,
            a.dtype,
            tuple(_size_key(s, envs) for s in a.shape),
            tuple(_size_key(s, envs) for s in a.stride()),
            _size_key(a.storage_offset(), envs),
        )
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node: Any = a.node
        env = getattr(node, "env", None)
        if env is None or node.hint is None:
            raise _Unkeyable
        if not envs:
            envs.append(env)
        elif envs[0] is not env:
            raise _Unkeyable
        return (type(a), node.pytype, node.expr)
    if isinstance(a, float):
        return (float, a.hex())
    if type(a) in _PLAIN:
        return (type(a), a)
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(_key(x, envs) for x in a))
    raise _Unkeyable


#: runs whose arguments hold no symbol: their key names every size as a number, so one table
#: serves every capture and trace in the process (bounded: emptied when full)
_STATIC: dict[Any, Any] = {}
_STATIC_LIMIT = 1 << 15


def static_entries() -> dict[Any, Any]:
    """The static table's entries (a copy): what a store keeps for later processes."""
    return dict(_STATIC)


def add_static(entries: dict[Any, Any]) -> None:
    """Entries of :func:`static_entries` from an earlier process of the same torch and Kiln
    (the caller's to ensure), where this process has none for their keys."""
    if len(_STATIC) + len(entries) >= _STATIC_LIMIT:
        return
    for key, entry in entries.items():
        _STATIC.setdefault(key, entry)


def _lookup_key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``(table, key)`` for this call, or None where the memo does not apply: the env's table
    where an argument has symbolic sizes, else the process's static one."""
    if not enabled[0] or not _memoizable(func):
        return None
    envs: list[Any] = []
    try:
        key = (
            func,
            torch.get_default_dtype(),
            tuple(_key(a, envs) for a in args),
            tuple((k, _key(v, envs)) for k, v in kwargs.items()),
        )
    except _Unkeyable:
        return None
    return (envs[0].op_results if envs else _STATIC), key


# one result: where it comes from (None: fresh; an argument's position: a view of it, or
# that argument itself where sizes and strides are None), sizes, strides, offset, dtype, and
# how it is made: for a fresh one by ``empty_strided`` (True), contiguous ``empty`` (False) or
# ``empty_permuted`` in a dimension order (a tuple of ints), whose storage sizes read as
# different expressions, or as a view of a fresh base (the base's own record); for a view of an
# argument whether autograd knows it as one (a Python meta kernel's view is not)
_Result = tuple[int | None, Any, Any, Any, torch.dtype, Any]


def recall(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(result, token)``: what an earlier run of this op on the same metadata gave, made
    anew (fresh tensors of its layouts, views of the same argument), or ``(None, token)`` for
    the caller to run the op and pass its result and the token to :func:`remember` (token
    None: nothing to remember)."""
    found = _lookup_key(func, args, kwargs)
    if found is None:
        return None, None
    table, key = found
    entry = table.get(key)
    if entry is None:
        return None, found
    rebuild, results = entry
    made = [_make(r, args) for r in results]
    return (made[0] if rebuild is None else rebuild(made)), None


def _make(result: _Result, args: tuple[Any, ...]) -> torch.Tensor:
    source, size, stride, offset, dtype, how = result
    if source is None:  # fresh: made as the op made it, so its storage's size reads alike
        if how is True:
            return _aten.empty_strided.default(size, stride, dtype=dtype, device="meta")
        if how is False:
            return _aten.empty.memory_format(size, dtype=dtype, device="meta")
        if all(isinstance(d, int) for d in how):  # as ``empty_permuted``'s: dense, not a view
            dense = _aten.empty.memory_format([size[d] for d in how], dtype=dtype, device="meta")
            with torch._C._AutoDispatchBelowADInplaceOrView():
                return _aten.as_strided.default(dense, size, stride, 0)
        return _aten.as_strided.default(_make(how, args), size, stride, offset)
    if size is None:
        return args[source]  # type: ignore[no-any-return]
    if how:
        return _aten.as_strided.default(args[source], size, stride, offset)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        return _aten.as_strided.default(args[source], size, stride, offset)


def remember(token: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    """Keep how ``out`` was made for ``token``'s key, if it is tensors of sizes known at the
    hints, each fresh or a view of (or the very) tensor argument given positionally."""
    if token is None:
        return
    rebuild: Callable[[list[torch.Tensor]], Any] | None
    if isinstance(out, torch.Tensor):
        outs, rebuild = [out], None
    elif type(out) in (tuple, list) and out:
        outs, rebuild = list(out), type(out)
    elif isinstance(out, tuple) and hasattr(type(out), "_fields") and out:
        # a named tuple (a Python decomposition's ``return_types_native_layer_norm``)
        outs, rebuild = list(out), functools.partial(_named, type(out))
    else:
        return
    leaves = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    sharing = collections.Counter(_storage(a) for a in leaves)
    taken = set(sharing)
    # a view is remade from the one argument on its storage: where arguments share a
    # storage, which one it views is not the key's to say
    on_storage = {_storage(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    positional = {s: i for s, i in on_storage.items() if sharing[s] == 1}
    seen: set[int] = set()
    results: list[_Result] = []
    for r in outs:
        result = _how_made(r, args, taken, positional, seen)
        if result is None:
            return
        results.append(result)
    table, key = token
    if table is _STATIC and len(table) >= _STATIC_LIMIT:
        table.clear()
    table[key] = (rebuild, tuple(results))


def _named(cls: Any, made: list[torch.Tensor]) -> Any:
    return cls(*made)


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _how_made(
    r: Any, args: tuple[Any, ...], taken: set[int], positional: dict[int, int], seen: set[int]
) -> _Result | None:
    if type(r) is not torch.Tensor or r.device.type != "meta" or r.layout != torch.strided:
        return None
    if r.requires_grad or r.is_conj() or r.is_neg():
        return None
    offset = r.storage_offset()
    if not all(_backed(s) for s in (*r.shape, *r.stride(), offset)):
        return None
    storage = _storage(r)
    if storage not in taken:  # fresh: alone on its own storage
        if storage in seen:
            return None
        seen.add(storage)
        if r._is_view():  # a view of a fresh tensor (attention's transposed logsumexp)
            base = r._base
            if base is None or _storage(base) != storage or r.dtype != base.dtype:
                return None
            made_base = _fresh(base, args)
            if made_base is None:
                return None
            result = (None, tuple(r.shape), tuple(r.stride()), offset, r.dtype, made_base)
            made = _make(result, args)
            same = _same_storage_size(made, r) and _expr(made.storage_offset()) == _expr(offset)
            return result if same and made._is_view() else None
        return _fresh(r, args)
    source = positional.get(storage)
    if source is None:
        return None
    base = args[source]
    if r is base:
        return (source, None, None, None, r.dtype, False)
    if r.dtype != base.dtype:  # a dtype view: as_strided keeps the argument's dtype
        return None
    return (source, tuple(r.shape), tuple(r.stride()), offset, r.dtype, r._is_view())


def _fresh(r: torch.Tensor, args: tuple[Any, ...]) -> _Result | None:
    """How to make ``r``, a tensor that is not a view, from nothing, or None (a view's base
    may have sizes the view does not, data-dependent ones included: those are never remade)."""
    if r._is_view() or not (isinstance(r.storage_offset(), int) and r.storage_offset() == 0):
        return None
    if not all(_backed(s) for s in (*r.shape, *r.stride())):
        return None
    for how in (True, False, _dense_order(r)):
        result = (None, tuple(r.shape), tuple(r.stride()), 0, r.dtype, how)
        made = _make(result, args)
        if _same_storage_size(made, r) and not made._is_view():
            return result
    return None


def _dense_order(r: torch.Tensor) -> tuple[int, ...]:
    """The dimension order, outermost first, that ``empty_permuted`` would lay ``r`` out in
    if ``r`` is dense (by the strides' hints; the caller checks the layout it makes)."""
    hints = [s.node.hint if isinstance(s, torch.SymInt) else s for s in r.stride()]
    return tuple(sorted(range(r.dim()), key=lambda d: -hints[d]))


def _same_storage_size(made: torch.Tensor, r: torch.Tensor) -> bool:
    """Whether ``made`` is laid out as ``r`` with a storage whose size is the same expression."""
    made_layout = (*made.stride(), made.untyped_storage().nbytes())
    layout = (*r.stride(), r.untyped_storage().nbytes())
    return all(_expr(a) == _expr(b) for a, b in zip(made_layout, layout, strict=True))


def _expr(n: Any) -> Any:
    """A size as an expression, compared without a guard (``==`` on SymInts would add one)."""
    return n.node.expr if isinstance(n, torch.SymInt) else n


def _backed(s: Any) -> bool:
    """Whether ``s`` is a number or a symbolic size with a hint (not from data)."""
    return not isinstance(s, torch.SymInt) or getattr(s.node, "hint", None) is not None
