"""The table from ATen overloads to lowering functions, and its decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["LOWERINGS", "register_lowering", "lowered_ops", "Lowering", "overloads"]

Lowering = Callable[..., Any]
LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}

_SKIP_OVERLOADS = ("out", "_out", "grad_input")


def _overloads(op: Any) -> list[torch._ops.OpOverload]:
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    found = []
    for name in op.overloads():
        if name == "out" or name.endswith(_SKIP_OVERLOADS):
            continue
        found.append(getattr(op, name))
    return found


def register_lowering(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register ``fn`` for each op (an ``OpOverload``, or every non-``out`` overload
    of an ``OpOverloadPacket``)."""

    def wrap(fn: Lowering) -> Lowering:
        for op in ops:
            for overload in _overloads(op):
                LOWERINGS[overload] = fn
        return fn

    return wrap


def lowered_ops() -> tuple[int, int]:
    """(distinct ATen ops, overloads) with a lowering: the coverage report."""
    packets = {op.overloadpacket for op in LOWERINGS}
    return len(packets), len(LOWERINGS)


def overloads(packet: str, *names: str) -> list[torch._ops.OpOverload]:
    """The named overloads of ``aten.<packet>`` this torch build has."""
    op = getattr(torch.ops.aten, packet, None)
    if op is None:
        return []
    return [getattr(op, n) for n in names if n in op.overloads()]
