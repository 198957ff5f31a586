"""One fused loopir kernel as one C++ function.

The function loops ``xindex`` over ``numel`` (and ``rindex`` over ``rnumel``
for reductions), running each node's body under :class:`KernelOps`, the ``ops``
handler that prints C++. Pointwise kernels vectorize ``xindex``; reductions
vectorize ``rindex`` with per-lane accumulators. A scalar loop handles the
tail, and the whole kernel falls back to scalar code when an op has no vector
form. The outer loop is an OpenMP ``parallel for`` when there is enough work.
Memory and control ops live here; elementwise math is :mod:`.ops`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence

import sympy
import torch

from kiln.codegen_cpp import lanes as lane_analysis
from kiln.codegen_cpp.dtypes import VECTOR_DTYPES, compute_ctype, storage_ctype, vector_ctype
from kiln.codegen_cpp.errors import CodegenCppError
from kiln.codegen_cpp.ops import CannotVectorize, CppOps, CppVar
from kiln.codegen_cpp.printer import cpp_index
from kiln.codegen_cpp.reductions import Accumulator
from kiln.codegen_cpp.segments import Segment, split_segments
from kiln.loopir import sizes
from kiln.loopir.kernel import RINDEX, XINDEX, KernelGroup, KernelNode
from kiln.loopir.virtualized import set_ops_handler

__all__ = ["PARALLEL_MIN_WORK", "SPLIT_REDUCTION_MAX_NUMEL", "KernelWriter"]

PARALLEL_MIN_WORK = 32768
"""Below this many element-iterations a kernel runs serially (a fork costs microseconds)."""

SPLIT_REDUCTION_MAX_NUMEL = 16
"""Reductions with fewer rows than this (and enough work) parallelize over ``rindex``."""

_LANE = sympy.Symbol("lane", integer=True, nonnegative=True)


@dataclasses.dataclass
class _Body:
    """Lines of one loop body and the values it already computed (for CSE)."""

    lines: list[str]
    cache: dict[str, CppVar]
    stored: dict[tuple[str, str], CppVar]
    reductions: dict[str, object] = dataclasses.field(default_factory=dict)


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

    def __init__(self, group: KernelGroup, symbol: str, lanes: int) -> None:
        self.group = group
        self.symbol = symbol
        self.lanes = lanes
        self.numel = _static(group.numel, "numel")
        self.rnumel = _static(group.rnumel, "rnumel")
        self.pointers = _pointer_names(group)
        self.vectorized = False
        self.vec_var: sympy.Symbol = XINDEX
        self.used_vector = False
        self.checks_indices = False  # some indirect index is bounds-checked at run time
        self._next_name = 0
        self._body = _Body([], {}, {})
        self._masks: list[str] = []
        self._segment: Segment | None = None

    # -- the function -----------------------------------------------------------
    def generate(self) -> str:
        """The whole ``extern "C"`` function."""
        params = [self._param(name) for name in self.group.args] + ["int64_t nthreads"]
        origins = ", ".join(self.group.origins()) or "?"
        lines = [
            f"// {self.group.name}: fuses {origins}",
            f"// numel={self.numel}, rnumel={self.rnumel}; "
            + ", ".join(f"{self.pointers[n]}={n}" for n in self.group.args),
            f'extern "C" void {self.symbol}({", ".join(params)}) {{',
        ]
        reduction_like = any(node.mode == "xr" for node in self.group.nodes)
        body = self._reduction_loops() if reduction_like else self._pointwise_loops()
        lines += ["  " + line if line else "" for line in body]
        lines.append("}")
        return "\n".join(lines)

    def _param(self, name: str) -> str:
        ctype = storage_ctype(self.group.buffers[name].dtype)
        if name in self.group.outputs:
            return f"{ctype}* {self.pointers[name]}"
        return f"const {ctype}* __restrict__ {self.pointers[name]}"

    def _parallel(self, work: int) -> list[str]:
        if work < PARALLEL_MIN_WORK:
            return []
        return ["#pragma omp parallel for num_threads(nthreads) schedule(static)"]

    def _can_vectorize(self, length: int) -> bool:
        return length >= self.lanes and all(
            layout.dtype in VECTOR_DTYPES for layout in self.group.buffers.values()
        )

    def _pointwise_loops(self) -> list[str]:
        nodes = self.group.nodes
        vec_lines = self._try_vector(lambda: self._run_nodes(nodes, XINDEX), self.numel)
        scalar_lines = self._scalar(lambda: self._run_nodes(nodes, XINDEX))
        if vec_lines is None:
            return [*self._parallel(self.numel), *_loop("xindex", 0, self.numel, 1, scalar_lines)]
        end = self.numel - self.numel % self.lanes
        lines = [*self._parallel(self.numel), *_loop("xindex", 0, end, self.lanes, vec_lines)]
        if end < self.numel:
            lines += _loop("xindex", end, self.numel, 1, scalar_lines)
        return lines

    def _reduction_loops(self) -> list[str]:
        work = self.numel * max(self.rnumel, 1)
        # Few rows of much work: split each row's reduction across threads instead.
        split_r = work >= PARALLEL_MIN_WORK and self.numel < SPLIT_REDUCTION_MAX_NUMEL
        inner: list[str] = []
        for part in split_segments(self.group.nodes):
            if isinstance(part, Segment):
                inner += self._segment_block(part, split_r)
            else:
                inner += self._scalar(functools.partial(self._run_nodes, [part], XINDEX))
        pragma = [] if split_r else self._parallel(work)
        return [*pragma, *_loop("xindex", 0, self.numel, 1, inner)]

    def _segment_block(self, segment: Segment, split_r: bool) -> list[str]:
        """One reduction loop over ``rindex``: accumulators, loop(s), folds, stores."""
        self._segment = segment
        try:
            vec_lines = self._try_vector(lambda: self._run_segment(segment), self.rnumel)
            segment.vectorized = vec_lines is not None
            if vec_lines is None:
                segment.reset()  # forget the failed vector pass's accumulators
            scalar_lines = self._scalar(lambda: self._run_segment(segment))
        finally:
            self._segment = None
        accs = segment.accumulators
        if split_r:
            lines = self._split_reduction(accs, vec_lines, scalar_lines)
        else:
            lines = [line for acc in accs for line in acc.declarations()]
            lines += self._r_loops("0", str(self.rnumel), vec_lines, scalar_lines)
            lines += [line for acc in accs for line in acc.fold_lanes()]
        lines += segment.final_stores
        return ["{", *("  " + line for line in lines), "}"]

    def _r_loops(
        self, start: str, end: str, vec_lines: list[str] | None, scalar_lines: list[str]
    ) -> list[str]:
        """The vector loop over whole vectors of [start, end), then the scalar rest."""
        if vec_lines is None:
            return list(_loop("rindex", start, end, 1, scalar_lines))
        static = start == "0" and end.isdigit()
        vec_end = str(int(end) - int(end) % self.lanes) if static else "rvec_end"
        lines = (
            []
            if static
            else [f"const int64_t rvec_end = {end} - ({end} - {start}) % {self.lanes};"]
        )
        lines += _loop("rindex", start, vec_end, self.lanes, vec_lines)
        if vec_end != end:
            lines += _loop("rindex", vec_end, end, 1, scalar_lines)
        return lines

    def _split_reduction(
        self, accs: list[Accumulator], vec_lines: list[str] | None, scalar_lines: list[str]
    ) -> list[str]:
        """Chunks of ``rindex`` reduced by parallel threads, merged in chunk order.

        Chunk starts are multiples of the lane count, which the vector loop's
        index analysis assumes; merging in order keeps results deterministic.
        """
        lines = [line for acc in accs for line in acc.declarations(with_vector=False)]
        lines += [
            f"const int64_t rchunk = (({self.rnumel} + nthreads - 1) / nthreads + "
            f"{self.lanes - 1}) / {self.lanes} * {self.lanes};",
            f"const int64_t nchunks = ({self.rnumel} + rchunk - 1) / rchunk;",
            *(line for acc in accs for line in acc.partial_arrays("nchunks")),
        ]
        body = [
            "const int64_t rstart = chunk * rchunk;",
            f"const int64_t rend = std::min<int64_t>(rstart + rchunk, {self.rnumel});",
            *(line for acc in accs for line in acc.declarations()),
            *self._r_loops("rstart", "rend", vec_lines, scalar_lines),
            *(line for acc in accs for line in acc.fold_lanes()),
            *(line for acc in accs for line in acc.save_partial("chunk")),
        ]
        lines += ["#pragma omp parallel for num_threads(nthreads) schedule(static)"]
        lines += _loop("chunk", "0", "nchunks", 1, body)
        merges = [line for acc in accs for line in acc.merge_partial("chunk")]
        if merges:
            lines += _loop("chunk", "0", "nchunks", 1, merges)
        return lines

    def _run_segment(self, segment: Segment) -> None:
        segment.start_pass()
        self._run_nodes(segment.nodes, XINDEX, RINDEX)

    def _run_nodes(
        self, nodes: Sequence[KernelNode], xindex: sympy.Expr, rindex: sympy.Expr | None = None
    ) -> None:
        with set_ops_handler(KernelOps(self)):
            for node in nodes:
                node.body(xindex, rindex if node.mode == "xr" else None)

    # -- passes -----------------------------------------------------------------------
    def _try_vector(self, run: Callable[[], None], length: int) -> list[str] | None:
        if not self._can_vectorize(length):
            return None
        self.vec_var = RINDEX if self._segment is not None else XINDEX
        first_name = self._next_name
        try:
            lines = self._pass(run, vectorized=True)
        except CannotVectorize:
            self._next_name = first_name  # the failed pass leaves no code behind
            return None
        self.used_vector = True
        return lines

    def _scalar(self, run: Callable[[], None]) -> list[str]:
        return self._pass(run, vectorized=False)

    def _pass(self, run: Callable[[], None], vectorized: bool) -> list[str]:
        saved = (self._body, self.vectorized)
        self._body, self.vectorized = _Body([], {}, {}), vectorized
        try:
            run()
            return self._body.lines
        finally:
            self._body, self.vectorized = saved

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
        self._body.lines.append(f"{ctype} {var} = {expr};")
        self._body.cache[key] = var
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
        dtype = self.group.buffers[name].dtype
        key = (name, str(index))
        if key in self._body.stored and self._mask is None:
            return self._body.stored[key]
        if not self.vectorized:
            return self.cse(self._read(name, cpp_index(index)), dtype)
        self._require_lane_safe(index)
        return self.cse(self._vector_load(name, index, dtype), dtype)

    def _require_lane_safe(self, index: sympy.Expr) -> None:
        if any(s.name.startswith("indirect") for s in index.free_symbols):
            raise CannotVectorize("indirect indexing")

    def _vector_load(self, name: str, index: sympy.Expr, dtype: torch.dtype) -> str:
        lane_read = self._read(name, self._lane_index(index))
        if self._mask is not None:
            if dtype == torch.bool:
                return f"kiln::mask_from_lanes([&](int64_t lane) {{ return {self._mask}.m[lane] && {lane_read}; }})"
            ctype = compute_ctype(dtype)
            return f"kiln::masked_lanes<{ctype}>({self._mask}, [&](int64_t lane) {{ return {lane_read}; }})"
        access = lane_analysis.lane_access(index, self.vec_var, self.lanes)
        if access is not None and access.stride == 0:
            scalar = self._read(name, cpp_index(access.base))
            return (
                f"kiln::Mask({scalar})"
                if dtype == torch.bool
                else f"{vector_ctype(dtype)}({scalar})"
            )
        if access is not None and access.stride == 1:
            address = f"{self.pointers[name]} + {cpp_index(access.base)}"
            if dtype == torch.bfloat16:
                return f"kiln::load_bf16({address})"
            if dtype == torch.float16:
                return f"kiln::load_half({address})"
            return f"{vector_ctype(dtype)}::loadu({address})"
        plain = dtype not in (torch.bool, torch.bfloat16, torch.float16)
        if access is not None and plain and access.stride.is_Integer:
            address = f"{self.pointers[name]} + {cpp_index(access.base)}"
            return f"{vector_ctype(dtype)}::gather({address}, {cpp_index(access.stride)})"
        if dtype == torch.bool:
            return f"kiln::mask_from_lanes([&](int64_t lane) {{ return {lane_read}; }})"
        ctype = compute_ctype(dtype)
        return f"kiln::from_lanes<{ctype}>([&](int64_t lane) {{ return {lane_read}; }})"

    def _to_storage(self, value: str, src: torch.dtype, dtype: torch.dtype) -> str:
        if dtype == torch.bfloat16:
            return f"kiln::float_to_bf16({value})"
        if dtype == torch.float16:
            return f"kiln::float_to_half({value})"
        if compute_ctype(src) != storage_ctype(dtype):
            return f"static_cast<{storage_ctype(dtype)}>({value})"
        return value

    def store(self, name: str, index: sympy.Expr, value: CppVar, mode: str | None = None) -> None:
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
                self._body.stored[(name, str(index))] = value
            return
        if mode is not None:
            raise CannotVectorize("accumulating store")
        self._require_lane_safe(index)
        self._vector_store(name, index, value, dtype, ptr)
        self._body.stored[(name, str(index))] = value

    def _vector_store(
        self, name: str, index: sympy.Expr, value: CppVar, dtype: torch.dtype, ptr: str
    ) -> None:
        if value.dtype != dtype and compute_ctype(value.dtype) != compute_ctype(dtype):
            value = self.cse(f"kiln::cast<{compute_ctype(dtype)}>({value})", dtype)
        access = lane_analysis.lane_access(index, self.vec_var, self.lanes)
        if access is not None and access.stride == 1:
            address = f"{ptr} + {cpp_index(access.base)}"
            if dtype == torch.bfloat16:
                self._body.lines.append(f"kiln::store_bf16({address}, {value});")
            elif dtype == torch.float16:
                self._body.lines.append(f"kiln::store_half({address}, {value});")
            else:
                self._body.lines.append(f"{value}.store({address});")
            return
        lane_value = f"{value}.m[lane] != 0" if dtype == torch.bool else f"{value}[lane]"
        converted = self._to_storage(lane_value, value.dtype, dtype)
        self._body.lines.append(
            f"for (int64_t lane = 0; lane < kiln::kLanes; ++lane) "
            f"{ptr}[{self._lane_index(index)}] = {converted};"
        )

    def load_seed(self, name: str, offset: int) -> CppVar:
        read = f"{self.pointers[name]}[{offset}]"
        if self.vectorized:
            return self.cse(f"kiln::Vec<int64_t>({read})", torch.int64)
        return self.cse(read, torch.int64)

    # -- indices ---------------------------------------------------------------------
    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> CppVar:
        ctype = compute_ctype(dtype)
        if not self.vectorized:
            return self.cse(f"static_cast<{ctype}>({cpp_index(expr)})", dtype)
        self._require_lane_safe(expr)
        access = lane_analysis.lane_access(expr, self.vec_var, self.lanes)
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
        if self.vectorized:
            raise CannotVectorize("indirect indexing")
        sym = sympy.Symbol(f"indirect{self._fresh()}", integer=True, nonnegative=True)
        bound = cpp_index(size)
        if check:
            self.checks_indices = True
            value = f"kiln::checked_index({x}, {bound})"
        else:
            value = f"{x} < 0 ? {x} + {bound} : {x}"
        self._body.lines.append(f"const int64_t {sym} = {value};")
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
        self._body = _Body(outer.lines, dict(outer.cache), {})
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
        segment = self._segment
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
            lambda: Accumulator(f"acc{self._fresh()}", reduction_type, acc_dtype)
        )
        if self.vectorized:
            acc.vectorized = True
        self._body.lines.append(acc.update(value, self.vectorized))  # type: ignore[arg-type]
        result = acc.results()
        self._body.reductions[key] = result
        return result

    def store_reduction(self, name: str, index: sympy.Expr, value: object) -> None:
        assert self._segment is not None and isinstance(value, CppVar)
        dtype = self.group.buffers[name].dtype
        converted = self._to_storage(value.name, value.dtype, dtype)
        self._segment.add_store(f"{self.pointers[name]}[{cpp_index(index)}] = {converted};")


def _static(expr: sympy.Expr, what: str) -> int:
    value = sizes.static_int(sympy.sympify(expr))
    if value is None:
        msg = f"the C++ backend needs static sizes; {what} is {expr} (dynamic shapes come later)"
        raise CodegenCppError(msg)
    return value


def _pointer_names(group: KernelGroup) -> dict[str, str]:
    names: dict[str, str] = {}
    counters = {"in": itertools.count(), "out": itertools.count()}
    for name in group.args:
        if name not in names:
            kind = "out" if name in group.outputs else "in"
            names[name] = f"{kind}_ptr{next(counters[kind])}"
    return names


def _loop(var: str, start: int | str, end: int | str, step: int, body: list[str]) -> Iterator[str]:
    increment = f"{var} += {step}" if step != 1 else f"++{var}"
    yield f"for (int64_t {var} = {start}; {var} < {end}; {increment}) {{"
    yield from ("  " + line for line in body)
    yield "}"
