"""Layouts: where a buffer's elements live (device, dtype, sizes, strides, offset)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy
import torch

from kiln.capture.eager_refusals import is_dense as _is_dense
from kiln.loopir import sizes, symbolic
from kiln.loopir.errors import IRVerificationError

__all__ = [
    "Layout",
    "contiguous_layout",
    "channels_last_layout",
    "ordered_layout",
    "layout_of_tensor",
    "is_dense",
]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A strided layout in elements. ``flexible`` means no one has asked for these
    strides yet, so a pass may still pick others (e.g. to match a consumer)."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    offset: sympy.Expr = sympy.S.Zero
    flexible: bool = False

    def index(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        """The storage position of a multi-dimensional index."""
        return sizes.linear_index(index, self.stride, self.offset)

    def numel(self) -> sympy.Expr:
        return sizes.product(self.size)

    def storage_size(self) -> sympy.Expr:
        """Elements the storage must hold (0 for an empty tensor)."""
        if any(s == 0 for s in self.size):
            return sympy.S.Zero
        return (
            self.offset
            + 1
            + sympy.Add(*[(n - 1) * s for n, s in zip(self.size, self.stride, strict=True)])
        )

    def nbytes(self) -> int:
        """Bytes of storage, for memory accounting (symbolic sizes at their hints)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return symbolic.hint(self.storage_size()) * elem

    def as_fixed(self) -> Layout:
        return dataclasses.replace(self, flexible=False)

    def with_strides(self, stride: Sequence[int | sympy.Expr]) -> Layout:
        """This layout fixed to ``stride`` (a new buffer given eager's strides)."""
        strides = tuple(sizes.sympify(s) for s in stride)
        return dataclasses.replace(self, stride=strides, flexible=False)

    def strides_match(self, t: torch.Tensor) -> bool:
        """Whether every dim longer than 1 steps through storage as ``t``'s does (a size
        computed from data may be 1: its stride must match too)."""
        if symbolic.unbacked_in(t):
            return t.dim() == len(self.size) and all(
                sizes.sympify(n) == 1 or sympy.expand(s - sizes.sympify(w)) == 0
                for n, s, w in zip(t.shape, self.stride, t.stride(), strict=True)
            )
        return t.dim() == len(self.size) and all(
            n == 1 or s == w for n, s, w in zip(t.shape, self.stride, t.stride(), strict=True)
        )

    def is_contiguous(self) -> bool:
        want = sizes.contiguous_strides(self.size)
        return all(n == 1 or s == w for n, s, w in zip(self.size, self.stride, want, strict=True))

    def verify(self) -> None:
        if len(self.size) != len(self.stride):
            msg = f"layout has {len(self.size)} sizes but {len(self.stride)} strides"
            raise IRVerificationError(msg)

    def __str__(self) -> str:
        kind = "Flexible" if self.flexible else "Fixed"
        size = ", ".join(map(str, self.size))
        stride = ", ".join(map(str, self.stride))
        dtype = str(self.dtype).removeprefix("torch.")
        off = f", offset={self.offset}" if self.offset != 0 else ""
        return f"{kind}Layout({self.device.type}, {dtype}, size=[{size}], stride=[{stride}]{off})"


def contiguous_layout(
    device: torch.device, dtype: torch.dtype, size: Sequence[sympy.Expr], flexible: bool = True
) -> Layout:
    """A row-major layout for a new buffer."""
    size = tuple(size)
    return Layout(device, dtype, size, tuple(sizes.contiguous_strides(size)), flexible=flexible)


def channels_last_layout(
    device: torch.device, dtype: torch.dtype, size: Sequence[sympy.Expr]
) -> Layout:
    """An NHWC layout for a new 4-D buffer (flexible): channels vary fastest."""
    n, c, h, w = size
    order = sizes.contiguous_strides([n, h, w, c])  # strides of the NHWC permutation
    return Layout(
        device, dtype, tuple(size), (order[0], order[3], order[1], order[2]), flexible=True
    )


def ordered_layout(
    device: torch.device, dtype: torch.dtype, size: Sequence[sympy.Expr], order: Sequence[int]
) -> Layout:
    """A dense layout (flexible) whose dims lie in memory in ``order``, outermost first."""
    stride: list[sympy.Expr] = [sympy.S.One] * len(size)
    step: sympy.Expr = sympy.S.One
    for d in reversed(order):
        stride[d] = step
        step = step * size[d]
    return Layout(device, dtype, tuple(size), tuple(stride), flexible=True)


def layout_of_tensor(t: torch.Tensor) -> Layout:
    """The fixed layout of a real, fake or meta tensor, relative to its data pointer.

    Kernels receive tensors and index from their first element, so the storage
    offset of an input is not part of its layout.
    """
    return Layout(
        t.device,
        t.dtype,
        tuple(sizes.sympify(s) for s in t.shape),
        tuple(sizes.sympify(s) for s in t.stride()),
    )


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a block of memory without gaps or repeats, in some order
    of its dimensions. Where a size is computed from data (unbacked), whether they do for
    every value it takes, asking the shape environment nothing (no call knows the value)."""
    if not symbolic.unbacked_in(t):
        return _is_dense(t)
    dims = [
        (sizes.sympify(st), sizes.sympify(n)) for n, st in zip(t.shape, t.stride(), strict=True)
    ]
    expected: sympy.Expr = sympy.S.One
    for stride, size in sorted(dims, key=lambda d: _order_key(d[0])):
        if size == 1:
            continue
        if sympy.expand(stride - expected) != 0:
            return False
        expected = expected * size
    return True


def _order_key(stride: sympy.Expr) -> float:
    """A stride's place in memory order, its symbols at a typical size (ties and wrong
    guesses only make :func:`is_dense` answer False, never wrongly True)."""
    big = {s: symbolic.UNBACKED_HINT for s in stride.free_symbols}
    return float(stride.xreplace(big))
