"""Meta tensors with symbolic sizes: the fakes of dynamic inputs.

A dynamic input's sizes are symbols of a ``ShapeEnv``; its strides are expressions over the
same symbols (the real tensor's dense layout, in the order of its strides), so a view of it
or an op's output has sizes and strides that follow the input's sizes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import sympy
import torch

from kiln.capture.shapes.env import ShapeEnv
from kiln.capture.shapes.node import SymNode, wrap
from kiln.capture.source import SizeSource, Source, StrideSource

__all__ = ["create_symint", "dense_order", "symbolic_meta"]

SymIntLike = torch.SymInt | int


def create_symint(
    env: ShapeEnv,
    hint: int,
    source: Source,
    *,
    dynamic: bool = True,
    min: int | None = None,
    max: int | None = None,
) -> SymIntLike:
    """``env.create_symbol`` as a torch value: a ``SymInt``, or an int where it specialized."""
    expr = env.create_symbol(hint, source, dynamic=dynamic, min=min, max=max)
    value = wrap(SymNode(expr, env, int, hint))
    assert isinstance(value, (torch.SymInt, int))
    return value


def symbolic_meta(
    tensor: torch.Tensor,
    source: Source,
    env: ShapeEnv,
    dynamic_dims: Collection[int] | None = None,
    ranges: Mapping[int, tuple[int | None, int | None]] | None = None,
) -> torch.Tensor:
    """A meta tensor like ``tensor`` whose sizes in ``dynamic_dims`` (every dim when None) are
    symbols read from ``source.size()[d]``, bounded by ``ranges[d] = (min, max)``.

    Strides follow the sizes when ``tensor`` is dense (broadcast dims aside: stride 0); a
    tensor that is not (a slice with gaps) keeps its strides as constants, guarded through
    ``source.stride()[d]``.
    """
    dims = range(tensor.dim()) if dynamic_dims is None else dynamic_dims
    ranges = ranges or {}
    sizes = [
        create_symint(
            env,
            n,
            SizeSource(source, d),
            dynamic=d in dims,
            min=ranges.get(d, (None, None))[0],
            max=ranges.get(d, (None, None))[1],
        )
        for d, n in enumerate(tensor.shape)
    ]
    strides = _dense_strides(tensor, sizes)
    if strides is None:
        strides = [
            create_symint(env, s, StrideSource(source, d), dynamic=False)
            for d, s in enumerate(tensor.stride())
        ]
    meta = torch.empty_strided(sizes, strides, dtype=tensor.dtype, device="meta")
    return meta.requires_grad_(tensor.requires_grad) if tensor.is_floating_point() else meta


def dense_order(tensor: torch.Tensor) -> tuple[int, ...]:
    """``tensor``'s dims innermost first (by stride): the order its symbolic strides follow."""
    if tensor.numel() == 0:
        # no element is ever read: any strides serve, so the contiguous ones
        return tuple(range(tensor.dim() - 1, -1, -1))
    return tuple(sorted(range(tensor.dim()), key=lambda d: (tensor.stride(d), tensor.size(d))))


def _dense_strides(tensor: torch.Tensor, sizes: list[SymIntLike]) -> list[SymIntLike] | None:
    """Strides over ``sizes`` with ``tensor``'s layout (its dims ordered by stride), or None
    when ``tensor`` is not dense in that order. Broadcast dims (stride 0, as ``expand`` makes:
    attention masks) keep stride 0 and the others are dense around them, so an expanded input
    follows its sizes too rather than recompiling for each one."""
    order = dense_order(tensor)
    strides: list[SymIntLike] = [0] * tensor.dim()
    expected: SymIntLike = 1
    real = 1
    for d in order:
        if tensor.numel() and tensor.size(d) != 1 and tensor.stride(d) == 0:
            continue  # a broadcast dim (``expand``): stride 0 whatever its size, a constant
        if tensor.numel() and tensor.size(d) != 1 and tensor.stride(d) != real:
            return None
        strides[d] = expected
        expected = expected * sizes[d]
        real *= tensor.size(d)
    return strides


def expr_of(value: SymIntLike | torch.SymFloat | torch.SymBool | float | bool) -> sympy.Basic:
    """The sympy expression of a torch symbolic value or Python number."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node = value.node
        if isinstance(node, SymNode):
            return node.expr
        msg = f"{value} is not a Kiln symbolic value"
        raise TypeError(msg)
    return sympy.sympify(value)
