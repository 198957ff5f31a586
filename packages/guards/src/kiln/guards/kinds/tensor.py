"""The ``TENSOR_MATCH`` kind: everything a compiled graph assumes about one input tensor.

Every tensor of a frame is checked in one boolean expression rather than by a helper over a
tuple of tensors: no call, no tuple, literals in the code. A tensor with symbolic sizes (``None``
entries, a ``dense_order``) is checked dim by dim over its shape and strides, each read once into
a local by an assignment expression inside that same expression; the frame's ``SHAPE`` guard
reads its sizes from those locals.
"""

from __future__ import annotations

from typing import Any

import torch

from kiln.capture.guard_data import (
    GuardKind,
    GuardSpec,
    TensorMeta,
    dense_in_order,
    storage_fits,
)
from kiln.guards import stamps
from kiln.guards.kinds.base import Emitter, Kind, Rank, register
from kiln.guards.kinds.values import type_name

__all__ = [
    "TensorMatch",
    "dispatch_key_names",
    "explain_tensor",
    "same_tensor_test",
    "storage_test",
]


def dispatch_key_names(t: torch.Tensor) -> frozenset[str]:
    """The names in a tensor's dispatch key set (slow; only when capture recorded them)."""
    text = str(torch._C._dispatch_keys(t))
    inner = text[text.find("(") + 1 : text.rfind(")")]
    return frozenset(k.strip() for k in inner.split(",") if k.strip())


def explain_tensor(where: str, value: Any, meta: TensorMeta) -> str | None:
    """The first way ``value`` differs from ``meta``, or None when it matches."""
    if not isinstance(value, torch.Tensor):
        return f"{where} is not a tensor: expected {meta.type.__qualname__}, got {type_name(value)}"
    if type(value) is not meta.type:
        name = type_name(value)
        return f"tensor {where} type mismatch: expected {meta.type.__qualname__}, got {name}"
    checks: list[tuple[str, Any, Any]] = [
        ("dtype", meta.dtype, value.dtype),
        ("device", meta.device, value.device),
        ("requires_grad", meta.requires_grad, value.requires_grad),
        ("rank", len(meta.sizes), value.dim()),
        ("negative bit", meta.neg, value.is_neg()),
        ("conjugate bit", meta.conj, value.is_conj()),
    ]
    for what, expected, got in checks:
        if expected != got:
            return f"tensor {where} {what} mismatch: expected {expected}, got {got}"
    for what, expected_seq, got_seq in (
        ("size", meta.sizes, tuple(value.shape)),
        ("stride", meta.strides, tuple(value.stride())),
    ):
        for i, (expected, got) in enumerate(zip(expected_seq, got_seq, strict=True)):
            if expected is not None and expected != got:
                return (
                    f"tensor {where} {what} mismatch at index {i}: expected {expected}, got {got}"
                )
    broadcast = {d for d, s in enumerate(meta.strides) if s == 0}
    if meta.dense_order is not None and not dense_in_order(value, meta.dense_order, broadcast):
        return (
            f"tensor {where} layout mismatch: expected a dense layout with dims "
            f"{meta.dense_order} innermost first, got strides {tuple(value.stride())} "
            f"for sizes {tuple(value.shape)}"
        )
    if meta.dispatch_keys and dispatch_key_names(value) != meta.dispatch_keys:
        got_keys = sorted(dispatch_key_names(value))
        return f"tensor {where} dispatch keys mismatch: expected {sorted(meta.dispatch_keys)}, got {got_keys}"
    return None


def _dispatch_keys_condition(out: Emitter, v: str, names: frozenset[str]) -> str:
    """Compare key sets as torch's raw integers; by names when a name is not a key here."""
    try:
        keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
        for name in names:
            keyset = keyset | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
        raw = keyset.raw_repr()
    except (AttributeError, TypeError):
        keys = out.bind(names, "keys")
        return f"{out.bind(dispatch_key_names, 'dispatch_keys')}({v}) == {keys}"
    return f"{out.bind(torch._C._dispatch_keys, 'dispatch_keys')}({v}).raw_repr() == {raw}"


_STRIDES = "\0strides"


def _requires_grad_test(out: Emitter, meta: TensorMeta, v: str) -> str:
    """``requires_grad`` read as eager would not: on a ``__torch_function__`` subclass the
    property reaches the user's override, whose side effects a guard must not add."""
    cls = meta.type
    overridden = cls is not torch.Tensor and (
        getattr(cls, "__torch_function__", None) is not torch._C._disabled_torch_function_impl
    )
    if not overridden:
        return f"{v}.requires_grad is {meta.requires_grad!r}"
    return f"{out.bind(_requires_grad, 'requires_grad')}({v}) is {meta.requires_grad!r}"


def _requires_grad(t: torch.Tensor) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return t.requires_grad


def _is_static(meta: TensorMeta) -> bool:
    return meta.dense_order is None and None not in meta.sizes and None not in meta.strides


def _dense_condition(meta: TensorMeta, v: str, shape: str | None, strides: str) -> str | None:
    """``dense_in_order`` as one expression over the kept shape and strides: each stride is
    the product of the sizes inside it, a dim of size 1 takes any stride, and a tensor
    without elements any strides. Static sizes fold into the products; None when no stride
    is constrained (a static size 0)."""
    assert meta.dense_order is not None
    terms: list[str] = []
    factors: list[str] = []
    static = 1
    for d in meta.dense_order:
        n = meta.sizes[d]
        if n == 0:
            return None
        if meta.strides[d] == 0:
            continue  # a broadcast dim: its stride 0 is tested with the static strides
        product = " * ".join([*factors, str(static)] if static != 1 or not factors else factors)
        # a static stride equal to the product is tested already (the innermost stride 1)
        pinned = not factors and meta.strides[d] == static
        if n is None:
            assert shape is not None
            if not pinned:
                terms.append(f"({strides}[{d}] == {product} or {shape}[{d}] == 1)")
            factors.append(f"{shape}[{d}]")
        elif n != 1:
            if not pinned:
                terms.append(f"{strides}[{d}] == {product}")
            static *= n
    if not terms:
        return None
    if shape is None:  # every size static and none 0: at least one element
        return " and ".join(terms)
    return f"({' and '.join(terms)} or {v}.numel() == 0)"


def _symbolic_condition(out: Emitter, meta: TensorMeta, v: str) -> list[str]:
    """Rank first, then the static sizes and strides, then the dense layout: a relation of
    the ``SHAPE`` guard reads a size by index only after the rank matched."""
    parts: list[str] = []
    shape: str | None = None
    if None in meta.sizes:
        first, shape = out.keep(f"{v}.shape", "shape")
        parts.append(f"len({first}) == {len(meta.sizes)}")
        parts.extend(f"{shape}[{d}] == {n}" for d, n in enumerate(meta.sizes) if n is not None)
    else:
        parts.append(f"{v}.shape == {tuple(meta.sizes)!r}")
    if meta.dense_order is None and None not in meta.strides:
        parts.append(f"{v}.stride() == {tuple(meta.strides)!r}")
        return parts
    # written over a placeholder for the strides' local, which is made only if a test reads it
    tests = [f"{_STRIDES}[{d}] == {s}" for d, s in enumerate(meta.strides) if s is not None]
    if meta.dense_order is not None:
        layout = _dense_condition(meta, v, shape, _STRIDES)
        if layout is not None:
            tests.append(layout)
    if not tests:
        return parts
    first, strides = out.keep(f"{v}.stride()", "strides")
    # the first test, always evaluated, reads the strides into the local the others read
    tests[0] = tests[0].replace(_STRIDES, first, 1)
    return [*parts, *(t.replace(_STRIDES, strides) for t in tests)]


_PLAIN_STORAGE = frozenset({"cpu", "cuda"})


def _storage_fits_inline(meta: TensorMeta, v: str) -> str | None:
    """:func:`storage_fits` as an expression over literals, for an ``nn.Parameter`` of static
    sizes and strides on a CPU or CUDA device (a group re-checks every parameter of its tree
    each time the stamp moved: every call of a module whose parameters FSDP swaps); ``""``
    when it holds without a look (no elements), None to call it (other tensors, whose storage
    may not be readable: ``storage_fits`` counts those as fitting)."""
    if meta.type is not torch.nn.Parameter or meta.device.type not in _PLAIN_STORAGE:
        return None
    if not _is_static(meta):
        return None
    sizes: tuple[int, ...] = tuple(n for n in meta.sizes if n is not None)
    strides: tuple[int, ...] = tuple(s for s in meta.strides if s is not None)
    if 0 in sizes:
        return ""
    extent = 1 + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))
    item = meta.dtype.itemsize
    return f"{v}.untyped_storage().nbytes() >= ({v}.storage_offset() + {extent}) * {item}"


def storage_test(out: Emitter, meta: TensorMeta, v: str) -> str:
    """The test that module state ``v``'s storage still holds its elements (a storage may be
    resized under a tensor: FSDP frees and refills its parameters'); ``""`` when none is
    needed."""
    fits = _storage_fits_inline(meta, v)
    return f"{out.bind(storage_fits, 'storage_fits')}({v})" if fits is None else fits


def same_tensor_test(out: Emitter, meta: TensorMeta, v: str) -> str | None:
    """What a re-check after a move of the stamp for tensors only must still test of module
    state ``v`` when it is the very tensor that last passed: its storage test (``""``: none),
    for a tracked parameter of static layout, whose other metadata changes all move the whole
    stamp (that runs the whole group instead); None for any other tensor (the whole test)."""
    if not _is_static(meta) or not stamps.tracks_class(meta.type):
        return None
    return storage_test(out, meta, v)


@register(GuardKind.TENSOR_MATCH)
class TensorMatch(Kind):
    """``expected`` is a :class:`TensorMeta`: type, sizes, strides, dtype, device,
    ``requires_grad``, the lazy negative/conjugate bits, and dispatch keys when recorded."""

    rank = Rank.TENSOR
    reads_twice = True
    batched = True
    tests_type = True
    stamp_protects = frozenset({"tensor"})

    def known_type(self, expected: Any) -> type | None:
        meta: TensorMeta = expected
        return meta.type

    def condition(self, out: Emitter, guard: GuardSpec, v: str) -> str:
        meta: TensorMeta = guard.expected
        dev = meta.device
        if dev.type in ("cpu", "meta") and dev.index is None:
            device = f"{v}.is_{dev.type}"
        else:
            device = f"{v}.device == {out.bind(dev, 'dev')}"
        if _is_static(meta):
            layout = [
                f"{v}.shape == {tuple(meta.sizes)!r}",
                f"{v}.stride() == {tuple(meta.strides)!r}",
            ]
        else:
            layout = _symbolic_condition(out, meta, v)
        parts = [
            f"type({v}) is {out.bind(meta.type, 'T')}",
            *layout,
            f"{v}.dtype is {out.bind(meta.dtype, 'dtype')}",
            device,
            _requires_grad_test(out, meta, v),
        ]
        if meta.dispatch_keys:
            parts.append(_dispatch_keys_condition(out, v, meta.dispatch_keys))
        if meta.dtype.is_floating_point or meta.dtype.is_complex:  # where lazy bits arise
            parts.append(f"{v}.is_neg() is {meta.neg!r}")
        if meta.dtype.is_complex:
            parts.append(f"{v}.is_conj() is {meta.conj!r}")
        if out.in_group:  # module state: its storage may have been resized under it
            fits = storage_test(out, meta, v)
            if fits:
                parts.append(fits)
        return " and ".join(parts)

    def explain(self, guard: GuardSpec, where: str, value: Any) -> str | None:
        return explain_tensor(where, value, guard.expected)
