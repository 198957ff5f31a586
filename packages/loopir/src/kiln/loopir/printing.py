"""The printing ``ops`` handler: readable dumps of kernel bodies and IR buffers.

Each ``ops`` call becomes a line ``tmpN = op(args)``, so a dump reads like the
loop body a codegen would emit. Used for ``kiln.loopir.ir`` logs, the reference
backend's "source", and tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.ir.buffers import Buffer, ComputedBuffer
from kiln.loopir.ir.loops import Reduction
from kiln.loopir.kernel import RINDEX, XINDEX, KernelGroup
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["PrintHandler", "render_group", "render_buffer", "render_buffers"]


def _fmt(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return str(value)


class _Tuple(tuple):  # type: ignore[type-arg]
    """A multi-result value (welford) whose elements print by name."""


class PrintHandler:
    """Records one line per ``ops`` call; values are the names of temporaries."""

    def __init__(self, indent: str = "    ") -> None:
        self.lines: list[str] = []
        self.indent = indent
        self._ids = itertools.count()
        self._indirect = itertools.count()

    def _emit(self, op: str, *args: Any) -> str:
        name = f"tmp{next(self._ids)}"
        self.lines.append(f"{self.indent}{name} = {op}({', '.join(_fmt(a) for a in args)})")
        return name

    def load(self, name: str, index: sympy.Expr) -> str:
        return self._emit("load", name, index)

    def store(self, name: str, index: sympy.Expr, value: str, mode: str | None = None) -> None:
        extra = f", mode={mode}" if mode else ""
        self.lines.append(f"{self.indent}store({name}, {index}, {value}{extra})")

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: Any
    ) -> Any:
        name = self._emit("reduction", reduction_type, dtype, value)
        if reduction_type == "welford_reduce":
            return _Tuple((f"{name}.mean", f"{name}.m2", f"{name}.weight"))
        return name

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        self.lines.append(f"{self.indent}store_reduction({name}, {index}, {value})")

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        return self._emit("index_expr", expr, dtype)

    def indirect_indexing(self, x: str, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        sym = sizes.index_symbol("indirect", next(self._indirect))
        self.lines.append(f"{self.indent}{sym} = indirect_indexing({x}, {size})")
        return sym

    def masked(self, mask: str, body: Callable[[], str], other: bool | float) -> str:
        self.lines.append(f"{self.indent}masked({mask}, other={other}):")
        saved, self.indent = self.indent, self.indent + "    "
        try:
            result = body()
        finally:
            self.indent = saved
        return self._emit("masked_result", mask, result, other)

    def __getattr__(self, name: str) -> Callable[..., str]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._emit(name, *args, *kwargs.values())


def _symbols(prefix: str, count: int) -> list[sympy.Expr]:
    return [sizes.index_symbol(prefix, i) for i in range(count)]


def render_buffer(buf: Buffer) -> str:
    """A buffer's header and, for a computed one, its body over ``i*``/``r*`` indices."""
    lines = [buf.describe()]
    if isinstance(buf, ComputedBuffer):
        handler = PrintHandler()
        data = buf.data
        index = _symbols("i", len(data.ranges))
        with set_ops_handler(handler):
            if isinstance(data, Reduction):
                rindex = _symbols("r", len(data.reduction_ranges))
                data.store_output(buf.storage_name(), buf.layout.index, index, rindex)
            else:
                data.store_output(buf.storage_name(), buf.layout.index, index)  # type: ignore[attr-defined]
        ranges = ", ".join(map(str, data.ranges))
        lines.append(f"  ranges=[{ranges}]" + _reduction_note(data))
        lines.extend(handler.lines)
    return "\n".join(lines)


def _reduction_note(data: Any) -> str:
    if isinstance(data, Reduction):
        rr = ", ".join(map(str, data.reduction_ranges))
        return f" reduction_ranges=[{rr}] {data.reduction_type}"
    return ""


def render_buffers(buffers: Sequence[Buffer], made_by: str) -> str:
    """The IR of a whole graph, headed by the pass that produced it."""
    parts = [f"# loopir IR after pass {made_by!r}"]
    parts.extend(render_buffer(b) for b in buffers)
    return "\n".join(parts)


def render_group(group: KernelGroup) -> str:
    """A fused kernel's nodes, each as the loop body a codegen would emit."""
    lines = [f"# {group.describe()}", f"# fused: {', '.join(group.origins())}"]
    for node in group.nodes:
        handler = PrintHandler()
        with set_ops_handler(handler):
            node.body(XINDEX, RINDEX if node.mode == "xr" else None)
        lines.append(f"  {node.buffer.name} ({node.kind}, loop {node.mode}):")
        lines.extend(handler.lines)
    return "\n".join(lines)
