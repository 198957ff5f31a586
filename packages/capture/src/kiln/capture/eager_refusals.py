"""Eager's refusals that meta kernels do not make.

Fakes run each op's meta kernel, which computes output metadata and checks what it needs for
that; eager's CPU and CUDA kernels refuse more. Where eager raises and the meta kernel lets the
arguments through, a graph would compute the op (or drop it when unused) where the program
raises, so :func:`check_as_eager` raises eager's error while tracing instead:

- mixed dtypes where the kernel does no type promotion (``mm`` of float and double);
- a reduction with no value over an empty input (``max`` of zero elements);
- ``-`` with a bool operand;
- a write whose memory overlaps its inputs' as TensorIterator refuses it: a written tensor
  with more than one element on one memory location (an expanded one), or an input that
  partly overlaps the written tensor (``x[:4].add_(x[2:6])``, ``y.copy_(y.t())``). Fakes of
  tensors sharing a storage share a meta storage, so the overlap is computed as ATen's
  ``get_overlap_status`` does, from storage offsets, sizes and strides.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from kiln.capture import op_args

__all__ = ["check_as_eager", "is_dense"]

aten = torch.ops.aten


def _packets(*names: str) -> frozenset[Any]:
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


# Ops whose CPU and CUDA kernels refuse tensor arguments of different dtypes (no type
# promotion) where the meta kernels let them through.
_SAME_DTYPE = _packets(
    "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "vdot", "addr", "convolution"
)

# Reductions with no value over zero elements: their CPU and CUDA kernels raise for an empty
# input (``max(): Expected reduction dim 0 to have non-zero size``), their meta kernels do not.
_REFUSE_EMPTY = _packets(
    "max", "min", "amax", "amin", "aminmax", "argmax", "argmin", "kthvalue", "median",
    "nanmedian", "mode",
)  # fmt: skip

# ``-`` with a bool operand: eager's kernels refuse it (use ``~`` or ``logical_not``)
_REFUSE_BOOL = _packets("sub", "rsub", "neg", "sub_", "neg_")

# Writes that TensorIterator checks for overlapping memory, besides the pointwise ops (ATen
# tags those): others (``fill_``, ``masked_fill_``, ``addmm_`` ...) check less or nothing.
_CHECKED_WRITES = _packets("copy_", "where", "index_add_", "index_add")

_INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
_PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer "
    "to a single memory location. Please clone() the tensor before performing the operation."
)


def check_as_eager(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise eager's error for ``func(*args, **kwargs)`` where the meta kernel would not.

    The real kernel runs on zero-stride stand-ins of the arguments (one element of memory
    each, none for an empty one) for the refusals that depend on dtypes and sizes only: these
    kernels raise before computing anything. Overlapping writes are checked here.
    """
    _check_overlap(func, args, kwargs)
    tensors = [a for a in op_args.leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    mixed = func.overloadpacket in _SAME_DTYPE and len({t.dtype for t in tensors}) >= 2
    empty = (
        func.overloadpacket in _REFUSE_EMPTY
        and not func._schema.is_mutable  # an out= stand-in would be written through
        and any(t.numel() == 0 for t in tensors)
    )
    booleans = func.overloadpacket in _REFUSE_BOOL and any(
        isinstance(a, bool) or (isinstance(a, torch.Tensor) and a.dtype == torch.bool)
        for a in op_args.leaves((args, kwargs))
    )
    if not (mixed or empty or booleans):
        return

    def stand_in(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return torch.zeros((), dtype=a.dtype).expand(a.shape)
        return a

    real_args, real_kwargs = pytree.tree_map(stand_in, (args, kwargs))
    with _disable_current_modes():
        func(*real_args, **real_kwargs)


@functools.cache
def _written(func: Any) -> tuple[int | str, ...]:
    """The positions (or keyword names) of the tensors ``func`` writes and TensorIterator
    checks for overlapping memory; empty for every other op."""
    checked = torch.Tag.pointwise in func.tags or func.overloadpacket in _CHECKED_WRITES
    if not checked or not func._schema.is_mutable:
        return ()
    return tuple(
        a.name if a.kwarg_only else i
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def _check_overlap(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    written = _written(func)
    if not written:
        return
    found = [
        args[w] if isinstance(w, int) and w < len(args) else kwargs.get(str(w)) for w in written
    ]
    outs: list[torch.Tensor] = [o for o in found if isinstance(o, torch.Tensor)]
    others = [
        a
        for a in op_args.leaves((args, kwargs))
        if isinstance(a, torch.Tensor) and not any(a is o for o in outs)
    ]
    for out in outs:
        if any(st == 0 and n > 1 for n, st in zip(out.shape, out.stride(), strict=True)):
            raise RuntimeError(_INTERNAL_OVERLAP)
        if any(_partly_overlap(out, other) for other in others):
            raise RuntimeError(_PARTIAL_OVERLAP)


def _partly_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's ``get_overlap_status(a, b) == Partial``: both dense on one storage, their
    memory ranges meet, and they are not the same range laid out alike."""
    if a.numel() == 0 or b.numel() == 0 or not (is_dense(a) and is_dense(b)):
        return False  # none, or too hard to tell: eager lets it through
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return False
    a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    if (a_begin, a_end) == (b_begin, b_end):
        return a.stride() != b.stride()
    return bool(a_begin < b_end and b_begin < a_end)


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a block of memory without gaps or repeats, in some order
    of its dimensions (ATen's ``is_non_overlapping_and_dense``)."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True
