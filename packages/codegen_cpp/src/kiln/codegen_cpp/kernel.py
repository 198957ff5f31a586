"""One fused loopir kernel as one C++ function.

The function loops ``xindex`` over ``numel`` (and ``rindex`` over ``rnumel``
for reductions), running each node's body under :class:`KernelOps`, the ``ops``
handler that prints C++. Pointwise kernels vectorize ``xindex``; reductions
vectorize ``rindex`` with per-lane accumulators. A scalar loop handles the
tail, and the whole kernel falls back to scalar code when an op has no vector
form. Which loops exist, which is vectorized and which is parallel is decided
in :mod:`.loops`; this module owns the passes that fill them (with CSE and
loop-invariant hoisting), memory and control ops. Elementwise math is :mod:`.ops`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Sequence

import sympy
import torch

from kiln.codegen_cpp import lanes as lane_analysis
from kiln.codegen_cpp.dtypes import VECTOR_DTYPES, compute_ctype, storage_ctype, vector_ctype
from kiln.codegen_cpp.errors import CodegenCppError
from kiln.codegen_cpp.loops import Extent, LoopNests
from kiln.codegen_cpp.ops import CannotVectorize, CppOps, CppVar
from kiln.codegen_cpp.periodic import TABLE_DTYPES, table_load
from kiln.codegen_cpp.printer import cpp_index
from kiln.codegen_cpp.reductions import Accumulator
from kiln.codegen_cpp.row_cache import ROW_CACHE_BYTES, RowCache
from kiln.codegen_cpp.segments import Segment
from kiln.codegen_cpp.size_args import float_args, size_bindings
from kiln.codegen_cpp.symbolic_rows import split_index
from kiln.loopir import sizes
from kiln.loopir.kernel import RINDEX, XINDEX, KernelGroup, KernelNode
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["Code", "KernelOps", "KernelWriter", "size_bindings"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_LANE = sympy.Symbol("lane", integer=True, nonnegative=True)


@functools.lru_cache(maxsize=16384)
def _index_key(index: sympy.Expr) -> str:
    """``str(index)``, remembered: loads and stores key what a kernel stored on the printed
    index, and sympy prints the long indices of symbolic sizes slowly (equal expressions
    print alike, so the cache answers as printing would)."""
    return str(index)


@dataclasses.dataclass
class Code:
    """A loop body: lines hoisted before the loop (invariant in it), and the body itself."""

    hoisted: list[str]
    lines: list[str]


@dataclasses.dataclass
class _Body:
    """Lines of one loop body and the values it already computed (for CSE).

    With ``hoisted`` set, values that depend neither on ``loop_var`` nor on a
    value computed inside the loop (``variant``) are declared there instead:
    loop-invariant code motion, which the C++ compiler cannot do itself when
    it must assume an output pointer may alias an input.
    """

    lines: list[str]
    cache: dict[str, CppVar]
    stored: dict[tuple[str, str], CppVar]
    reductions: dict[str, object] = dataclasses.field(default_factory=dict)
    hoisted: list[str] | None = None
    loop_var: str = ""
    variant: set[str] = dataclasses.field(default_factory=set)

    def invariant(self, expr: str) -> bool:
        if self.hoisted is None:
            return False
        names = set(_NAME.findall(expr))
        return self.loop_var not in names and not names & self.variant


class KernelOps(CppOps):
    """The full ``ops`` handler: elementwise math from :class:`CppOps`, memory here."""

    def __init__(self, writer: KernelWriter) -> None:
        super().__init__(writer)
        self.writer = writer

    def load(self, name: str, index: sympy.Expr) -> CppVar:
        return self.writer.load(name, index)

    def store(self, name: str, index: sympy.Expr, value: CppVar, mode: str | None = None) -> None:
        self.writer.store(name, index, value, mode)

    def reduction(
        self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: object
    ) -> object:
        return self.writer.reduction(dtype, reduction_type, value)

    def store_reduction(self, name: str, index: sympy.Expr, value: object) -> None:
        self.writer.store_reduction(name, index, value)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> CppVar:
        return self.writer.index_expr(expr, dtype)

    def indirect_indexing(self, x: CppVar, size: sympy.Expr, check: bool = True) -> sympy.Symbol:
        return self.writer.indirect_indexing(x, size, check)

    def masked(self, mask: CppVar, body: Callable[[], CppVar], other: bool | float) -> CppVar:
        return self.writer.masked(mask, body, other)

    def load_seed(self, name: str, offset: int) -> CppVar:
        return self.writer.load_seed(name, offset)


class KernelWriter:
    """Generates the C++ function ``symbol`` for ``group``; see the module docstring."""

    def __init__(self, group: KernelGroup, symbol: str, lanes: int, *, simd: bool = True) -> None:
        self.group = group
        self.symbol = symbol
        self.lanes = lanes
        self.simd = simd
        self.numel = Extent(group.numel)
        self.rnumel = Extent(group.rnumel)
        self.pointers = _pointer_names(group)
        self.size_symbols, self.size_args = size_bindings(group)
        self.float_args = float_args(self.size_args, group)
        # Extents of loop symbols that replace xindex (2-D pointwise loops), for simplification.
        self.index_ranges: dict[sympy.Symbol, int] = {}
        # (period, row, column, numel) of rows of a symbolic length (see symbolic_rows)
        self.index_split: tuple[sympy.Expr, sympy.Symbol, sympy.Symbol, sympy.Expr] | None = None
        self.vectorized = False
        self.vec_var: sympy.Symbol = XINDEX
        self.periodic_tables = False  # per-channel loads may read tables (periodic.py)
        self.used_vector = False
        self.checks_indices = False  # some indirect index is bounds-checked at run time
        self._next_name = 0
        self._body = _Body([], {}, {})
        self._masks: list[str] = []
        # Vector values equal in every lane, and each vector indirect index's lanes.
        self._uniform: set[str] = set()
        self._indirect: dict[sympy.Symbol, CppVar] = {}
        self.segment: Segment | None = None
        rnumel = self.rnumel.static or 0
        self.row_cache = (
            RowCache(rnumel, tail=rnumel % lanes != 0)
            if simd and rnumel > 1 and rnumel * 8 <= ROW_CACHE_BYTES
            else None
        )

    # -- the function -----------------------------------------------------------
    def generate(self) -> str:
        """The whole ``extern "C"`` function."""
        params = [self._param(name, i) for i, name in enumerate(self.group.args)]
        params += [f"int64_t {name}" for name in self.size_symbols]
        params += [
            f"{'double' if name in self.float_args else 'int64_t'} {name}"
            for name in self.size_args
        ]
        params.append("int64_t nthreads")
        origins = ", ".join(self.group.origins()) or "?"
        lines = [
            f"// {self.group.name}: fuses {origins}",
            f"// numel={self.numel}, rnumel={self.rnumel}; "
            + ", ".join(f"{self.pointers[n]}={n}" for n in self.group.args),
            f'extern "C" void {self.symbol}({", ".join(params)}) {{',
        ]
        body = LoopNests(self).build()
        if self.row_cache is not None and self.row_cache.plan():
            self._next_name = 0
            self._uniform.clear()
            body = LoopNests(self).build()  # again, sharing values between a row's loops
        lines += ["  " + line if line else "" for line in body]
        lines.append("}")
        return "\n".join(lines)

    def _param(self, name: str, position: int) -> str:
        if position < len(self.group.args) - 1 - self.group.args[::-1].index(name):
            # A buffer both read and written is passed twice; the last pointer serves.
            return f"const void* /* {name} again */ unused{position}"
        ctype = storage_ctype(self.group.buffers[name].dtype)
        if name in self.group.outputs:
            return f"{ctype}* {self.pointers[name]}"
        return f"const {ctype}* __restrict__ {self.pointers[name]}"

    def _can_vectorize(self, length: Extent) -> bool:
        return (
            self.simd
            and length.at_least(self.lanes)
            and all(layout.dtype in VECTOR_DTYPES for layout in self.group.buffers.values())
        )

    def run_segment(self, segment: Segment) -> None:
        segment.start_pass()
        self.run_nodes(segment.nodes, XINDEX, RINDEX)

    def run_nodes(
        self, nodes: Sequence[KernelNode], xindex: sympy.Expr, rindex: sympy.Expr | None = None
    ) -> None:
        with set_ops_handler(KernelOps(self)):
            for node in nodes:
                node.body(xindex, rindex if node.mode == "xr" else None)

    # -- passes -----------------------------------------------------------------------
    def vector_pass(
        self, run: Callable[[], None], length: Extent, var: sympy.Symbol
    ) -> Code | None:
        """Lines of ``run`` vectorized along ``var``; None when something cannot be."""
        if not self._can_vectorize(length):
            return None
        self.vec_var = var
        first_name = self._next_name
        try:
            lines = self._pass(run, True, var.name)
        except CannotVectorize:
            self._next_name = first_name  # the failed pass leaves no code behind
            return None
        self.used_vector = True
        return lines

    def nested_lines(self, run: Callable[[], None], loop_var: str) -> Code:
        """Code of ``run`` in the current pass, for a nested loop over ``loop_var``: it
        sees the values computed so far, and what it computes stays inside it."""
        outer = self._body
        self._body = _Body([], dict(outer.cache), {}, hoisted=[], loop_var=loop_var)
        try:
            run()
            return Code(self._body.hoisted or [], self._body.lines)
        finally:
            self._body = outer

    def emit_lines(self, lines: list[str]) -> None:
        self._body.lines += lines

    def scalar_pass(self, run: Callable[[], None], loop_var: str = "") -> Code:
        """Scalar code of ``run``; with ``loop_var``, invariants of that loop are hoisted."""
        return self._pass(run, False, loop_var)

    def _pass(self, run: Callable[[], None], vectorized: bool, loop_var: str) -> Code:
        saved = (self._body, self.vectorized)
        hoisted: list[str] | None = [] if loop_var else None
        self._body = _Body([], {}, {}, hoisted=hoisted, loop_var=loop_var)
        self.vectorized = vectorized
        try:
            run()
            return Code(self._body.hoisted or [], self._body.lines)
        finally:
            self._body, self.vectorized = saved

    def simplify_index(self, index: sympy.Expr) -> sympy.Expr:
        """Drop digits the loop ranges make trivial, then rejoin split ones (the range-aware
        simplifier rejoins them itself)."""
        if self.index_ranges:
            return sizes.simplify_with_ranges(sympy.expand(index), self.index_ranges)
        if self.index_split is not None:
            return split_index(index, *self.index_split)
        return sizes.merge_digits(index)

    def _fresh(self) -> int:
        self._next_name += 1
        return self._next_name - 1

    # -- CSE ---------------------------------------------------------------------------
    def cse(self, expr: str, dtype: torch.dtype) -> CppVar:
        """A variable holding ``expr`` (reused when the body already computed it)."""
        key = f"{dtype}:{expr}"
        found = self._body.cache.get(key)
        if found is not None:
            return found
        var = CppVar(f"tmp{self._fresh()}", dtype)
        ctype = "auto" if self.vectorized else f"const {compute_ctype(dtype)}"
        body = self._body
        invariant = body.invariant(expr)
        if self.vectorized and invariant and _is_uniform(expr, self._uniform):
            self._uniform.add(var.name)
        shared = ""
        if self.row_cache is not None:
            expr, shared = self.row_cache.value(
                var.name, expr, dtype, not invariant, self.vectorized
            )
        if invariant:
            assert body.hoisted is not None
            body.hoisted.append(f"{ctype} {var} = {expr};")
        else:
            body.lines += [f"{ctype} {var} = {expr};", *([shared] if shared else [])]
            body.variant.add(var.name)
        body.cache[key] = var
        return var

    @property
    def _mask(self) -> str | None:
        return self._masks[-1] if self._masks else None

    # -- memory ----------------------------------------------------------------------
    def _read(self, name: str, index: str) -> str:
        dtype = self.group.buffers[name].dtype
        element = f"{self.pointers[name]}[{index}]"
        if dtype == torch.bfloat16:
            return f"kiln::bf16_to_float({element})"
        if dtype == torch.float16:
            return f"static_cast<float>({element})"
        return element

    def _lane_index(self, index: sympy.Expr) -> str:
        return cpp_index(index.subs(self.vec_var, self.vec_var + _LANE))

    def load(self, name: str, index: sympy.Expr) -> CppVar:
        index = self.simplify_index(index)
        dtype = self.group.buffers[name].dtype
        key = (name, _index_key(index))
        if key in self._body.stored and self._mask is None:
            return self._body.stored[key]
        if not self.vectorized:
            return self.cse(self._read(name, cpp_index(index)), dtype)
        index, per_lane = self._vector_index(index)
        return self.cse(self._vector_load(name, index, dtype, per_lane), dtype)

    def _vector_index(self, index: sympy.Expr) -> tuple[sympy.Expr, bool]:
        """``index`` with its vector indirect indices read as lane 0 when equal in every
        lane (an embedding row per ``xindex``), else as each lane's own (True: per lane)."""
        found = [s for s in index.free_symbols if s.name.startswith("indirect")]
        if not found:
            return index, False
        if any(s not in self._indirect for s in found):
            raise CannotVectorize("indirect indexing")
        per_lane = False
        for sym in found:
            var = self._indirect[sym]
            lane = "0" if var.name in self._uniform else "lane"
            per_lane |= lane == "lane"
            index = index.subs(sym, sympy.Symbol(f"{var}[{lane}]", integer=True, nonnegative=True))
        return index, per_lane

    def _vector_load(self, name: str, index: sympy.Expr, dtype: torch.dtype, per_lane: bool) -> str:
        lane_read = self._read(name, self._lane_index(index))
        plain = None if per_lane else self._plain_vector_load(name, index, dtype)
        if self._mask is None:
            table = None if plain else self._table_load(name, index, dtype)
            return plain or table or self._lanewise_load(lane_read, dtype)
        if plain is None:
            if dtype == torch.bool:
                return f"kiln::mask_from_lanes([&](int64_t lane) {{ return {self._mask}.m[lane] && {lane_read}; }})"
            return f"kiln::masked_lanes<{compute_ctype(dtype)}>({self._mask}, [&](int64_t lane) {{ return {lane_read}; }})"
        contiguous = f"{vector_ctype(dtype)}::loadu("
        if plain.startswith(contiguous) and dtype in (torch.float32, torch.int32):
            ctype = compute_ctype(dtype)
            return f"kiln::masked_loadu<{ctype}>({self._mask}, {plain[len(contiguous) : -1]})"
        helper = (
            "kiln::masked_load_mask"
            if dtype == torch.bool
            else f"kiln::masked_load<{compute_ctype(dtype)}>"
        )
        return f"{helper}({self._mask}, [&] {{ return {plain}; }}, [&](int64_t lane) {{ return {lane_read}; }})"

    def _plain_vector_load(self, name: str, index: sympy.Expr, dtype: torch.dtype) -> str | None:
        """A broadcast, contiguous or strided vector load, if the index is affine in the lane."""
        access = lane_analysis.lane_access(index, self.vec_var, self.lanes)
        if access is None:
            return None
        if access.stride == 0:
            scalar = self._read(name, cpp_index(access.base))
            return (
                f"kiln::Mask({scalar})"
                if dtype == torch.bool
                else f"{vector_ctype(dtype)}({scalar})"
            )
        address = f"{self.pointers[name]} + {cpp_index(access.base)}"
        if access.stride == 1:
            if dtype == torch.bfloat16:
                return f"kiln::load_bf16({address})"
            if dtype == torch.float16:
                return f"kiln::load_half({address})"
            return f"{vector_ctype(dtype)}::loadu({address})"
        if dtype in (torch.bool, torch.bfloat16, torch.float16):
            return None
        return f"{vector_ctype(dtype)}::gather({address}, {cpp_index(access.stride)})"

    def _table_load(self, name: str, index: sympy.Expr, dtype: torch.dtype) -> str | None:
        """A per-channel load from a table filled before the loop (``periodic.py``)."""
        hoisted, read = self._body.hoisted, functools.partial(self._read, name)
        if not self.periodic_tables or hoisted is None or dtype not in TABLE_DTYPES:
            return None
        cache = self._body.cache
        return table_load(cache, hoisted, name, index, self.vec_var, self.lanes, dtype, read)

    def _lanewise_load(self, lane_read: str, dtype: torch.dtype) -> str:
        if dtype == torch.bool:
            return f"kiln::mask_from_lanes([&](int64_t lane) {{ return {lane_read}; }})"
        return (
            f"kiln::from_lanes<{compute_ctype(dtype)}>([&](int64_t lane) {{ return {lane_read}; }})"
        )

    def _to_storage(self, value: str, src: torch.dtype, dtype: torch.dtype) -> str:
        if dtype == torch.bfloat16:
            return f"kiln::float_to_bf16({value})"
        if dtype == torch.float16:
            return f"kiln::float_to_half({value})"
        if compute_ctype(src) != storage_ctype(dtype):
            return f"static_cast<{storage_ctype(dtype)}>({value})"
        return value

    def store(self, name: str, index: sympy.Expr, value: CppVar, mode: str | None = None) -> None:
        index = self.simplify_index(index)
        dtype = self.group.buffers[name].dtype
        ptr = self.pointers[name]
        lines = self._body.lines
        if not self.vectorized:
            converted = self._to_storage(value.name, value.dtype, dtype)
            target = f"{ptr}[{cpp_index(index)}]"
            if mode == "atomic_add":
                if dtype in (torch.bfloat16, torch.float16, torch.bool):
                    lines += [
                        "#pragma omp critical",
                        f"{target} = {self._to_storage(f'{self._read(name, cpp_index(index))} + {value}', value.dtype, dtype)};",
                    ]
                else:
                    lines += ["#pragma omp atomic", f"{target} += {converted};"]
            else:
                lines.append(f"{target} = {converted};")
                self._body.stored[(name, _index_key(index))] = value
            return
        if mode is not None:
            raise CannotVectorize("accumulating store")
        index, per_lane = self._vector_index(index)
        if per_lane:
            raise CannotVectorize("indirect store")
        self._body.lines += self._vector_store_lines(name, index, value, dtype)
        self._body.stored[(name, _index_key(index))] = value

    def _vector_store_lines(
        self, name: str, index: sympy.Expr, value: CppVar, dtype: torch.dtype
    ) -> list[str]:
        ptr = self.pointers[name]
        vec = value.name
        if value.dtype != dtype and compute_ctype(value.dtype) != compute_ctype(dtype):
            vec = f"kiln::cast<{compute_ctype(dtype)}>({value})"
        access = lane_analysis.lane_access(index, self.vec_var, self.lanes)
        if access is not None and access.stride == 1:
            address = f"{ptr} + {cpp_index(access.base)}"
            if dtype == torch.bfloat16:
                return [f"kiln::store_bf16({address}, {vec});"]
            if dtype == torch.float16:
                return [f"kiln::store_half({address}, {vec});"]
            return [
                f"{vec}.store({address});" if vec == value.name else f"({vec}).store({address});"
            ]
        lane_value = f"{value}.m[lane] != 0" if value.dtype == torch.bool else f"{value}[lane]"
        converted = self._to_storage(lane_value, value.dtype, dtype)
        return [
            f"for (int64_t lane = 0; lane < kiln::kLanes; ++lane) "
            f"{ptr}[{self._lane_index(index)}] = {converted};"
        ]

    def load_seed(self, name: str, offset: int) -> CppVar:
        read = f"{self.pointers[name]}[{offset}]"
        if self.vectorized:
            return self.cse(f"kiln::Vec<int64_t>({read})", torch.int64)
        return self.cse(read, torch.int64)

    # -- indices ---------------------------------------------------------------------
    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> CppVar:
        expr = self.simplify_index(expr)
        ctype = compute_ctype(dtype)
        if not self.vectorized:
            return self.cse(f"static_cast<{ctype}>({cpp_index(expr)})", dtype)
        expr, per_lane = self._vector_index(expr)
        access = None if per_lane else lane_analysis.lane_access(expr, self.vec_var, self.lanes)
        if access is None:
            lane_value = f"static_cast<{ctype}>({self._lane_index(expr)})"
            return self.cse(
                f"kiln::from_lanes<{ctype}>([&](int64_t lane) {{ return {lane_value}; }})", dtype
            )
        base = f"static_cast<{ctype}>({cpp_index(access.base)})"
        if access.stride == 0:
            return self.cse(f"kiln::Vec<{ctype}>({base})", dtype)
        stride = f"static_cast<{ctype}>({cpp_index(access.stride)})"
        return self.cse(f"kiln::iota<{ctype}>({base}, {stride})", dtype)

    def indirect_indexing(self, x: CppVar, size: sympy.Expr, check: bool) -> sympy.Symbol:
        bound = cpp_index(size)
        self.checks_indices |= check
        if not self.vectorized:
            fixed = (
                f"kiln::checked_index({x}, {bound})" if check else f"{x} < 0 ? {x} + {bound} : {x}"
            )
            # Named like any value, so later loops of a row recognise what it indexes.
            return sympy.Symbol(self.cse(fixed, torch.int64).name, integer=True, nonnegative=True)
        if x.dtype != torch.int64:
            raise CannotVectorize("indirect index of another dtype than int64")
        fix = f"kiln::checked_index(t, {bound})" if check else f"t < 0 ? t + {bound} : t"
        sym = sympy.Symbol(f"indirect{self._fresh()}", integer=True, nonnegative=True)
        self._indirect[sym] = self.cse(
            f"kiln::map({x}, [&](int64_t t) {{ return {fix}; }})", torch.int64
        )
        return sym

    def masked(self, mask: CppVar, body: Callable[[], CppVar], other: bool | float) -> CppVar:
        if self.vectorized:
            return self._vector_masked(mask, body, other)
        outer = self._body
        self._body = _Body([], dict(outer.cache), dict(outer.stored))
        try:
            result = body()
            inner = self._body.lines
        finally:
            self._body = outer
        fn = f"tmp{self._fresh()}"
        outer.variant.add(fn)
        outer.lines += [
            f"auto {fn} = [&] {{",
            *("  " + line for line in inner),
            f"  return {result};",
            "};",
        ]
        fill = KernelOps(self).constant(other, result.dtype)
        return self.cse(f"{mask} ? {fn}() : {fill}", result.dtype)

    def _vector_masked(
        self, mask: CppVar, body: Callable[[], CppVar], other: bool | float
    ) -> CppVar:
        active = (
            mask.name if self._mask is None else self.cse(f"{self._mask} & {mask}", torch.bool).name
        )
        outer = self._body
        self._body = _Body(outer.lines, dict(outer.cache), {}, variant=outer.variant)
        self._masks.append(active)
        try:
            result = body()
        finally:
            self._masks.pop()
            self._body = outer
        fill = KernelOps(self).constant(other, result.dtype)
        return self.cse(f"kiln::where({mask}, {result}, {fill})", result.dtype)

    # -- reductions --------------------------------------------------------------------
    def reduction(self, dtype: torch.dtype, reduction_type: str, value: object) -> object:
        segment = self.segment
        if segment is None:
            msg = f"{self.group.name}: a reduction outside a reduction loop"
            raise CodegenCppError(msg)
        acc_dtype = dtype
        if isinstance(value, tuple):
            acc_dtype = value[0].dtype
        # Welford's three outputs arrive as three reductions of one value: fold once.
        key = f"{reduction_type}:{dtype}:{value}"
        if key in self._body.reductions:
            return self._body.reductions[key]
        acc = segment.accumulator(
            lambda: Accumulator(
                f"acc{self._fresh()}", reduction_type, acc_dtype, row_lanes=segment.row_lanes
            )
        )
        if self.vectorized:
            acc.vectorized = True
        self._body.lines.append(acc.update(value, self.vectorized))  # type: ignore[arg-type]
        result = acc.results()
        self._body.reductions[key] = result
        return result

    def store_reduction(self, name: str, index: sympy.Expr, value: object) -> None:
        assert self.segment is not None and isinstance(value, CppVar)
        dtype = self.group.buffers[name].dtype
        index = self.simplify_index(index)
        if self.vectorized and self.segment.row_lanes:
            for line in self._vector_store_lines(name, index, value, dtype):
                self.segment.add_store(line)
            return
        converted = self._to_storage(value.name, value.dtype, dtype)
        self.segment.add_store(f"{self.pointers[name]}[{cpp_index(index)}] = {converted};")


def _is_uniform(expr: str, uniform: set[str]) -> bool:
    """An invariant vector expression equal in every lane: no per-lane construction, and
    every value it uses is uniform too."""
    if re.search(r"\blane\b|kiln::iota", expr):
        return False
    return all(name in uniform for name in re.findall(r"\btmp\d+\b", expr))


def _pointer_names(group: KernelGroup) -> dict[str, str]:
    names: dict[str, str] = {}
    counters = {"in": itertools.count(), "out": itertools.count()}
    for name in group.args:
        if name not in names:
            kind = "out" if name in group.outputs else "in"
            names[name] = f"{kind}_ptr{next(counters[kind])}"
    return names
