"""The Triton kernel writer: one ``KernelGroup`` becomes one ``@triton.jit`` function.

Pointwise kernels tile ``xindex`` in blocks of ``XBLOCK``. Reduction kernels
work on ``[XBLOCK, RBLOCK]`` tiles: *persistent* when the whole reduction fits in
one block (every node straight-line, each reduction a ``tl.sum``-style call),
*looped* otherwise, with ``for roffset in range(0, rnumel, RBLOCK)`` loops whose
accumulators live per lane and are folded after the loop. A looped kernel opens
a new loop when a node reads a reduction the current loop is still computing
(softmax: max, then sum of exp, then the output).

Values go through a scoped CSE table; a store records its value so later reads
of the same element are forwarded, and stores of ``internal`` buffers nobody
reads from memory are dropped when the source is rendered. A read of memory the
kernel itself wrote that cannot be forwarded (a later loop, another index) waits
at a ``tl.debug_barrier()``: the elements may have been stored by other threads
of the block, and only a barrier makes their stores visible.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from typing import Any

import sympy
import torch

from kiln.codegen_triton.module_cache import MODULE_HEADER
from kiln.codegen_triton.ops import CSEVar, TritonOps, triton_type
from kiln.codegen_triton.printer import print_index
from kiln.codegen_triton.reductions import Reductions
from kiln.codegen_triton.symbolic_sizes import SymbolicSizes, group_symbols, make_sizes, upper_bound
from kiln.codegen_triton.tiling import YINDEX, choose_tile, split_index
from kiln.loopir import serialize, sizes, symbolic
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.errors import StaticShapesOnly
from kiln.loopir.kernel import RINDEX, XINDEX, KernelGroup, KernelNode
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["TritonKernel", "KernelSource", "INT32_LIMIT"]

INT32_LIMIT = 2**31 - 1
BARRIER = "tl.debug_barrier()"


@dataclasses.dataclass
class _Store:
    """A store line, dropped at render time if its buffer turns out unneeded."""

    name: str
    text: str


@dataclasses.dataclass
class _Loop:
    """One ``for roffset`` loop: accumulator setup, body, and the folds after it."""

    pre: list[str] = dataclasses.field(default_factory=list)
    body: list[str | _Store] = dataclasses.field(default_factory=list)
    post: list[str | _Store] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A rendered kernel and what its launcher needs to know."""

    name: str
    source: str
    reduction: bool
    persistent: bool
    numel: int
    rnumel: int
    int64: bool
    tile: int = 0
    """The inner size of a 2-D tiled pointwise kernel (0: not tiled)."""
    outer: bool = False
    """A reduction whose loads are contiguous along x, not r (per-channel statistics of
    an NHWC tensor): it wants wide ``XBLOCK`` and short ``RBLOCK`` to read coalesced."""
    symbolic: SymbolicSizes | None = None
    """A kernel over symbolic sizes (``numel``/``rnumel`` are then the hints): its size
    arguments and how the launcher computes them per call."""

    __reduce__ = serialize.by_fields

    @property
    def module_text(self) -> str:
        """The file the kernel is imported from: the common imports, then the kernel."""
        return MODULE_HEADER + "\n" + self.source

    @property
    def kind(self) -> str:
        if self.reduction:
            return "reduction"
        return "tiled" if self.tile else "pointwise"

    @property
    def sizes(self) -> list[int]:
        """The size arguments the kernel takes after its pointers."""
        if self.reduction:
            return [self.numel, self.rnumel]
        return [self.tile, self.numel // self.tile] if self.tile else [self.numel]


_NAMED_OPS = 3  # ops named in a kernel's name; the comment under its def lists them all


def kernel_name(group: KernelGroup, reduction: bool, persistent: bool, tiled: bool) -> str:
    """``kiln_<kind>_<ops>_<n>``: what a profiler or a trace shows for the kernel.

    The kind is ``per`` (persistent reduction), ``red`` (looped reduction), ``tile`` (2-D tiled
    pointwise) or ``poi``; the ops are the first ATen ops it fuses (``aten.add.Tensor`` as
    ``add``), and ``n`` is loopir's kernel number, so names stay unique in a graph.
    """
    kind = ("per" if persistent else "red") if reduction else ("tile" if tiled else "poi")
    ops = [origin.split(".")[1] if origin.count(".") >= 2 else origin for origin in group.origins()]
    words = [re.sub(r"[^0-9A-Za-z]+", "_", op).strip("_") for op in ops[:_NAMED_OPS]]
    number = re.sub(r"\D", "", group.name) or "0"
    return "_".join(["kiln", kind, *filter(None, words), number])


class TritonKernel:
    """Writes the body of one kernel; ``TritonOps`` calls back into it."""

    def __init__(
        self, group: KernelGroup, *, persistent_limit: int = 1024, tiling: bool = True
    ) -> None:
        self.group = group
        self.symbols = group_symbols(group)
        self.used_symbols: set[sympy.Symbol] = set()  # size symbols the source names
        numel, rnumel = sympy.sympify(group.numel), sympy.sympify(group.rnumel)
        size = symbolic.hint if self.symbols else sizes.evaluate_int
        self.numel, self.rnumel = size(numel), size(rnumel)
        # a reduction over a size-1 (or empty) range still needs the [XBLOCK, RBLOCK] form
        self.is_reduction = group.is_reduction or any(
            n.mode == "xr" or n.kind == "reduction" for n in group.nodes
        )
        # a symbolic row holds in one block only where every admitted size fits
        longest = upper_bound(rnumel) if rnumel.free_symbols else self.rnumel
        self.persistent = self.is_reduction and longest <= persistent_limit
        self.extents = _extents(group)
        self.int64 = _needs_int64(self.extents)
        self.params = _param_names(group)
        self.tile = (choose_tile(group) or 0) if tiling else 0
        # symbolic lengths are no range simplification can use
        self.ranges = {s: int(n) for s, n in ((XINDEX, numel), (RINDEX, rnumel)) if n.is_Integer}
        self.top: list[str | _Store | _Loop] = []
        self.loop: _Loop | None = None
        self.scopes: list[dict[Any, Any]] = [{}]
        self.mode = "x"
        self.masks: list[str] = []
        self.loaded_from_memory: set[str] = set()
        self.contiguous_along = {XINDEX: 0, RINDEX: 0}  # loads contiguous in x, in r
        self.written: dict[str, _Loop | None] = {}  # buffer -> loop whose body stores it
        self.fenced = False  # a barrier was emitted in line since the last store
        self.reductions = Reductions(self)
        self._names = itertools.count()
        self._indirect = itertools.count()
        self.name = kernel_name(group, self.is_reduction, self.persistent, bool(self.tile))

    # -- emission and CSE --
    def emit(self, line: str | _Store) -> None:
        (self.loop.body if self.loop is not None else self.top).append(line)

    def new_name(self, prefix: str = "tmp") -> str:
        return f"{prefix}{next(self._names)}"

    def lookup(self, key: Any) -> Any:
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def cse(self, expr: str, dtype: torch.dtype) -> CSEVar:
        found = self.lookup(expr)
        if found is not None:
            return found  # type: ignore[no-any-return]
        var = CSEVar(self.new_name(), dtype)
        self.emit(f"{var} = {expr}")
        self.scopes[-1][expr] = var
        return var

    # -- shapes and masks --
    @property
    def shape(self) -> str:
        if self.tile:
            return "[XBLOCK, YBLOCK]"
        if not self.is_reduction:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if self.mode == "xr" else "[XBLOCK, 1]"

    def full_mask(self) -> str:
        parts = ["xmask", "rmask"] if self.mode == "xr" else ["xmask"]
        if self.tile:
            parts = ["xmask", "ymask"]
        return " & ".join(parts + self.masks)

    def _index(self, index: sympy.Expr) -> tuple[sympy.Expr, str]:
        if self.tile:
            expr = split_index(index, self.tile, self.numel // self.tile)
            return expr, print_index(expr)
        expr = sizes.simplify_with_ranges(index, self.ranges)
        return expr, self._print(expr)

    def _print(self, expr: sympy.Expr) -> str:
        """Triton for ``expr``, noting the size symbols it names (kernel arguments)."""
        if self.symbols or symbolic.in_symbolic_graph():
            self.used_symbols |= symbolic.size_symbols([expr])
        return print_index(expr)

    def _load_mask(self, expr: sympy.Expr) -> str | None:
        syms = expr.free_symbols
        indirect = any(sizes.is_index_symbol(s, "indirect") for s in syms)
        parts = []
        if indirect or XINDEX in syms:
            parts.append("xmask")
        if self.mode == "xr" and (indirect or RINDEX in syms):
            parts.append("rmask")
        if self.tile and (indirect or YINDEX in syms):
            parts.append("ymask")
        parts += self.masks
        return " & ".join(parts) if parts else None

    def _pointer(self, name: str, expr: sympy.Expr, text: str) -> str:
        """A pointer block of the full tile shape (stores need it)."""
        syms = expr.free_symbols
        wanted = {XINDEX, RINDEX} if self.mode == "xr" else {XINDEX}
        if self.tile:
            wanted = {XINDEX, YINDEX}
        if wanted <= syms and not any(sizes.is_index_symbol(s, "indirect") for s in syms):
            return f"{self.params[name]} + ({text})"
        if not syms:
            itype = "tl.int64" if self.int64 else "tl.int32"
            return f"{self.params[name]} + tl.full({self.shape}, {text}, {itype})"
        return f"{self.params[name]} + tl.broadcast_to({text}, {self.shape})"

    # -- memory --
    def load(self, name: str, index: sympy.Expr) -> CSEVar:
        expr, text = self._index(index)
        forwarded = self.lookup(("stored", name, text))
        if forwarded is not None:
            return forwarded  # type: ignore[no-any-return]
        self.loaded_from_memory.add(name)
        if name in self.written:
            self._wait_for_stores(name)
        dtype = self.group.buffers[name].dtype
        self._count_contiguity(expr)
        mask = self._load_mask(expr)
        if not self.masks and self._may_leave(name, expr):
            # name the address once, then keep discarded lanes inside the buffer
            text = self.cse(text, torch.int64).name
            size = sizes.evaluate_int(self.group.buffers[name].storage_size())
            guard = f"({text} >= 0) & ({text} < {size})"
            mask = guard if mask is None else f"{mask} & {guard}"
        pointer = f"{self.params[name]} + ({text})"
        if mask and not expr.free_symbols:  # Triton wants a block pointer under a block mask
            pointer = self._pointer(name, expr, text)
        args = pointer + (f", {mask}, other=0" if mask else "")
        return self.cse(f"tl.load({args})", dtype)

    def _count_contiguity(self, expr: sympy.Expr) -> None:
        """Note whether a tile load steps by one element along x or along r."""
        if self.mode != "xr" or not {XINDEX, RINDEX} <= expr.free_symbols:
            return
        at = {XINDEX: 0, RINDEX: 0}
        try:
            base = _number(expr.subs(at))
            steps = {s: _number(expr.subs(at | {s: 1})) - base for s in at}
        except (TypeError, StaticShapesOnly):  # an indirect index: no fixed step
            return
        for symbol, step in steps.items():
            self.contiguous_along[symbol] += step == 1

    def _wait_for_stores(self, name: str) -> None:
        """Put a barrier between this kernel's stores of ``name`` and a read of them.

        Triton gives a load and a store of the same tile their own thread layouts, so
        an element read here may have been written by another thread. A read in a
        later loop waits once, before that loop starts; a read where the store was
        (same loop, other index; or straight-line code) waits in line.
        """
        if self.loop is not None and self.written[name] is not self.loop:
            if BARRIER not in self.loop.pre:
                self.loop.pre.append(BARRIER)
        elif not self.fenced:
            self.emit(BARRIER)
            self.fenced = True

    def _written(self, name: str, loop: _Loop | None) -> None:
        self.written[name] = loop
        self.fenced = False

    def _may_leave(self, name: str, expr: sympy.Expr) -> bool:
        """True when a load's address can fall outside its buffer on some lane.

        A lowering that selects among loads with ``where`` and leaves one unmasked would
        compute addresses outside the buffer on the lanes it discards: loopir's reference
        backend rejects such a load in its tests, and this guard keeps one that the tests
        do not reach from faulting. Loads inside ``ops.masked`` (every lane the mask
        leaves on is in bounds: the reference backend checks it) and indirect loads are in
        bounds by contract.
        """
        size = sizes.static_int(self.group.buffers[name].storage_size())
        if size is None or any(sizes.is_index_symbol(s, "indirect") for s in expr.free_symbols):
            return False
        ranges = dict(self.ranges)
        if self.tile:
            ranges = {XINDEX: self.tile, YINDEX: self.numel // self.tile}
        bound = sizes.bounds(expr, ranges)
        return bound is None or bound[0] < 0 or bound[1] >= size

    def store(self, name: str, index: sympy.Expr, value: CSEVar, mode: str | None) -> None:
        expr, text = self._index(index)
        value = self._as_buffer_dtype(name, value)
        ptr = self._pointer(name, expr, text)
        self._written(name, self.loop)
        if mode == "atomic_add":
            self.loaded_from_memory.add(name)
            self.emit(f"tl.atomic_add({ptr}, {value}, {self.full_mask()}, sem='relaxed')")
            return
        self.emit(_Store(name, f"tl.store({ptr}, {value}, {self.full_mask()})"))
        self.scopes[-1][("stored", name, text)] = value

    def store_reduction(self, name: str, index: sympy.Expr, value: CSEVar) -> None:
        saved, self.mode = self.mode, "x"
        try:
            expr, text = self._index(index)
            value = self._as_buffer_dtype(name, value, after_loop=True)
            line = _Store(name, f"tl.store({self._pointer(name, expr, text)}, {value}, xmask)")
            (self.loop.post if self.loop is not None else self.top).append(line)
            self.scopes[0][("stored", name, text)] = value
            self._written(name, None)
        finally:
            self.mode = saved

    def _as_buffer_dtype(self, name: str, value: CSEVar, after_loop: bool = False) -> CSEVar:
        dtype = self.group.buffers[name].dtype
        if value.dtype == dtype:
            return value
        if not after_loop or self.loop is None:
            return TritonOps(self).to_dtype(value, dtype)
        var = CSEVar(self.new_name(), dtype)
        conv = f"{value} != 0" if dtype == torch.bool else f"{value}.to({triton_type(dtype)})"
        self.loop.post.append(f"{var} = {conv}")
        return var

    def index_expr(self, index: sympy.Expr, dtype: torch.dtype) -> CSEVar:
        if any(symbolic.is_number_symbol(s) for s in sympy.sympify(index).free_symbols):
            # Triton would type a Python float argument float32: the graph compiles per value
            msg = f"a Triton kernel takes the float {index} only as a constant"
            raise StaticShapesOnly(msg)
        expr, text = self._index(index)
        if not expr.free_symbols:
            return TritonOps(self).constant(int(expr), dtype)
        return self.cse(f"({text}).to({triton_type(dtype)})", dtype)

    def indirect_indexing(self, x: CSEVar, size: sympy.Expr) -> sympy.Symbol:
        key = ("indirect", x.name, str(size))
        found = self.lookup(key)
        if found is not None:
            return found  # type: ignore[no-any-return]
        sym = sizes.index_symbol("indirect", next(self._indirect))
        bound = self._print(sympy.sympify(size))
        self.emit(f"{sym.name} = tl.where({x} < 0, {x} + {bound}, {x})")
        self.scopes[-1][key] = sym
        return sym

    def masked_body(self, mask: CSEVar, body: Callable[[], Any]) -> CSEVar:
        self.masks.append(f"{mask}")
        try:
            result = body()
        finally:
            self.masks.pop()
        return result  # type: ignore[no-any-return]

    def load_seed(self, name: str, offset: int) -> CSEVar:
        self.loaded_from_memory.add(name)
        return self.cse(f"tl.load({self.params[name]} + {offset})", torch.int64)

    # -- driving --
    def generate(self) -> KernelSource:
        handler = TritonOps(self)
        pending: set[str] = set()  # reductions the open loop computes
        for node in self.group.nodes:
            if node.mode == "x" or self.persistent:
                self._close_loop()
            elif self.loop is None or pending & _reads(node):
                self._close_loop()
                self._open_loop()
                pending = set()
            self.mode = node.mode if self.is_reduction else "x"
            with set_ops_handler(handler):
                node.body(XINDEX, RINDEX if node.mode == "xr" else None)
            if node.kind == "reduction":
                pending.add(node.name)
        self._close_loop()
        source = self.render()
        return KernelSource(
            self.name, source, self.is_reduction, self.persistent,
            self.numel, self.rnumel, self.int64, self.tile,
            self.contiguous_along[XINDEX] > self.contiguous_along[RINDEX],
            self._symbolic_sizes(),
        )  # fmt: skip

    def _symbolic_sizes(self) -> SymbolicSizes | None:
        if not (self.symbols or self.used_symbols):
            return None
        checked = () if self.int64 else self.extents
        return make_sizes(self.group, self.used_symbols, checked)

    def _open_loop(self) -> None:
        self.loop = _Loop()
        self.top.append(self.loop)
        self.scopes.append({})

    def _close_loop(self) -> None:
        self.fenced = False
        if self.loop is not None:
            self.scopes.pop()
            self.loop = None

    # -- rendering --
    def render(self) -> str:
        params = [self.params[n] for n in dict.fromkeys(self.group.args)]
        params.append("xnumel")
        if self.is_reduction or self.tile:
            params.append("rnumel" if self.is_reduction else "ynumel")
        params += sorted((s.name for s in self.used_symbols), key=lambda n: (int(n[1:]), n))
        params.append("XBLOCK: tl.constexpr")
        if self.is_reduction or self.tile:
            params.append("RBLOCK: tl.constexpr" if self.is_reduction else "YBLOCK: tl.constexpr")
        lines = [
            "@triton.jit",
            f"def {self.name}({', '.join(params)}):",
            f"    # {', '.join(self.group.origins())}",
            *("    " + line for line in self._preamble()),
        ]
        for item in self.top:
            lines.extend(self._render_item(item))
        return "\n".join(lines) + "\n"

    def _preamble(self) -> list[str]:
        pid = "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"
        lines = [f"xoffset = {pid} * XBLOCK"]
        if self.tile:
            ypid = "tl.program_id(1).to(tl.int64)" if self.int64 else "tl.program_id(1)"
            return [
                *lines,
                "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                "xmask = xindex < xnumel",
                f"yoffset = {ypid} * YBLOCK",
                "yindex = yoffset + tl.arange(0, YBLOCK)[None, :]",
                "ymask = yindex < ynumel",
            ]
        if not self.is_reduction:
            return [*lines, "xindex = xoffset + tl.arange(0, XBLOCK)", "xmask = xindex < xnumel"]
        rbase = "tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if self.int64 else "")
        lines += [
            "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
            "xmask = xindex < xnumel",
            f"rbase = {rbase}",
        ]
        if self.persistent:
            lines += ["rindex = rbase", "rmask = rindex < rnumel"]
        return lines

    def _keep(self, item: str | _Store) -> str | None:
        if isinstance(item, str):
            return item
        if item.name in self.group.internal and item.name not in self.loaded_from_memory:
            return None
        return item.text

    def _render_item(self, item: str | _Store | _Loop) -> list[str]:
        if not isinstance(item, _Loop):
            kept = self._keep(item)
            return [] if kept is None else ["    " + kept]
        lines = ["    " + line for line in item.pre]
        lines += [
            "    for roffset in range(0, rnumel, RBLOCK):",
            "        rindex = roffset + rbase",
            "        rmask = rindex < rnumel",
        ]
        lines += ["        " + k for k in map(self._keep, item.body) if k is not None]
        lines += ["    " + k for k in map(self._keep, item.post) if k is not None]
        return lines


def _reads(node: KernelNode) -> set[str]:
    handler = ReadWriteHandler()
    with set_ops_handler(handler):
        node.body(XINDEX, RINDEX if node.mode == "xr" else None)
    return handler.read_names()


def _param_names(group: KernelGroup) -> dict[str, str]:
    params: dict[str, str] = {}
    for i, name in enumerate(dict.fromkeys(group.inputs)):
        params[name] = f"in_ptr{i}"
    outputs = [n for n in dict.fromkeys(group.outputs) if n not in params]
    for i, name in enumerate(outputs):
        params[name] = f"out_ptr{i}"
    return params


def _extents(group: KernelGroup) -> list[sympy.Expr]:
    """The iteration space and every buffer's storage size: what 32-bit indices reach."""
    iterations = sympy.sympify(group.numel) * sympy.sympify(group.rnumel)
    return [iterations, *(sympy.sympify(lay.storage_size()) for lay in group.buffers.values())]


def _needs_int64(extents: list[sympy.Expr]) -> bool:
    """64-bit indices where a size passes 2**31-1; a symbolic size is judged by this call's
    value (the launcher of a 32-bit kernel refuses a later call that passes the limit)."""
    if not any(e.free_symbols for e in extents):
        return max(sizes.evaluate_int(e) for e in extents) > INT32_LIMIT
    return max(symbolic.hint(e) for e in extents) > INT32_LIMIT


def _number(expr: sympy.Expr) -> int:
    """An index offset as a number, size symbols at their hints."""
    if expr.is_Integer:
        return int(expr)
    if symbolic.size_symbols([expr]) and not expr.free_symbols - symbolic.size_symbols([expr]):
        return symbolic.hint(expr)
    raise TypeError(expr)
