"""The loop nests of a kernel: which loops, which one is vectorized, which is parallel.

- Pointwise: vectors of ``xindex`` (``parallel for``), then a scalar tail.
- Reductions over a contiguous dimension: rows of ``xindex`` in parallel, each
  with ``rindex`` loops vectorized with per-lane accumulators.
- Reductions over a strided dimension (a column sum): vectors of ``xindex``
  (each lane its own row) with a scalar ``rindex`` loop inside, so every load
  stays contiguous and no lanes need folding; scalar rows finish the tail.
- Few long rows: each row's ``rindex`` range split into chunks across threads.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import sympy

from kiln.codegen_cpp import lanes as lane_analysis
from kiln.codegen_cpp.printer import cpp_index
from kiln.codegen_cpp.reductions import Accumulator
from kiln.codegen_cpp.row_cache import drop_unused
from kiln.codegen_cpp.segments import Segment, load_indices, split_segments
from kiln.codegen_cpp.symbolic_rows import quotient, split_index, symbolic_periods
from kiln.loopir import sizes
from kiln.loopir.kernel import RINDEX, XINDEX
from kiln.loopir.sizes import FloorDiv, ModularIndexing

if TYPE_CHECKING:
    from kiln.codegen_cpp.kernel import Code, KernelWriter

__all__ = ["PARALLEL_MIN_WORK", "SPLIT_REDUCTION_MAX_NUMEL", "Extent", "LoopNests", "loop"]

PARALLEL_MIN_WORK = 32768
"""Below this many element-iterations a kernel runs serially (a fork costs microseconds)."""

SPLIT_REDUCTION_MAX_NUMEL = 16
"""Reductions with fewer rows than this (and enough work) parallelize over ``rindex``."""

CASCADE_BLOCK = 4096
"""Elements per block of a long vectorized float sum (see ``LoopNests._r_loops``)."""

ROW_UNROLL = 4
"""Vectors of rows side by side in a reduction over a strided dimension."""

ROW_MIN_LANES = 4
ROW_MIN_ROWS = 16
"""A pointwise kernel whose loads are all contiguous or broadcast along ``xindex`` still
loops over rows (to compute per-row values once per row) when rows hold at least
``ROW_MIN_LANES`` vectors and there are at least ``ROW_MIN_ROWS`` rows to share out."""

_ROW = sympy.Symbol("xrow", integer=True, nonnegative=True)
_COL = sympy.Symbol("xcol", integer=True, nonnegative=True)
_PARALLEL_FOR = "#pragma omp parallel for num_threads(nthreads) schedule(static)"


class Extent:
    """A loop's trip count: a known int, or a C++ expression over size symbols.

    Decisions that need the value (vectorize? split? go parallel?) assume a
    symbolic extent is large; the generated code then checks at run time.
    """

    def __init__(self, expr: sympy.Expr) -> None:
        self.static = sizes.static_int(sympy.sympify(expr))
        self.text = cpp_index(expr)

    def __str__(self) -> str:
        return self.text

    def at_least(self, n: int) -> bool:
        return self.static is None or self.static >= n

    def below(self, n: int) -> bool:
        return self.static is not None and self.static < n

    def round_down(self, step: int) -> str:
        """The largest multiple of ``step`` not above the extent, as C++."""
        if self.static is not None:
            return str(self.static - self.static % step)
        text = self.text if self.text.isidentifier() else f"({self.text})"  # 2 * s0 + 1
        return f"({self.text} - {text} % {step})"

    def times(self, other: Extent) -> Extent | None:
        if self.static is not None and other.static is not None:
            return Extent(sympy.Integer(self.static * max(other.static, 1)))
        return None


def loop(
    var: str, start: int | str, end: int | str | Extent, step: int, body: list[str]
) -> Iterator[str]:
    """``for (int64_t var = start; var < end; var += step) { body }``."""
    increment = f"{var} += {step}" if step != 1 else f"++{var}"
    yield f"for (int64_t {var} = {start}; {var} < {end}; {increment}) {{"
    yield from ("  " + line for line in body)
    yield "}"


def _block(lines: list[str]) -> list[str]:
    return ["{", *("  " + line for line in lines), "}"]


class LoopNests:
    """Builds the body of ``writer``'s function (see the module docstring)."""

    def __init__(self, writer: KernelWriter) -> None:
        self.w = writer

    def build(self) -> list[str]:
        # A kernel with nothing to write runs no code at all: a load hoisted out of an empty loop
        # would read an input with no elements (an index into an empty index tensor).
        numel = self.w.numel
        if numel.static == 0:
            return []
        nests = self._reduction() if any(n.mode == "xr" for n in self.w.group.nodes) else None
        lines = self._pointwise() if nests is None else nests
        return lines if numel.static is not None else [f"if ({numel} <= 0) return;", *lines]

    def _parallel(self, work: Extent | None) -> list[str]:
        """The OpenMP pragma when ``work`` (None: unknown at compile time) is enough."""
        if work is None:
            w = self.w
            total = w.numel.text if w.rnumel.static == 1 else f"{w.numel} * {w.rnumel}"
            return [f"{_PARALLEL_FOR} if({total} >= {PARALLEL_MIN_WORK})"]
        return [_PARALLEL_FOR] if work.at_least(PARALLEL_MIN_WORK) else []

    def _pointwise(self) -> list[str]:
        w = self.w
        if w.numel.static is None:
            symbolic = self._symbolic_period()
            found = None if symbolic is None else self._symbolic_rows(symbolic)
            if found is not None:
                return found
        period = self._row_period()
        if period is not None:
            rows = self._pointwise_rows(period)
            if rows is not None:
                return rows
        run = functools.partial(w.run_nodes, w.group.nodes, XINDEX)
        w.periodic_tables = True  # its hoisted lines precede the parallel loop
        try:
            vec = w.vector_pass(run, w.numel, XINDEX)
        finally:
            w.periodic_tables = False
        scalar = w.scalar_pass(run, "xindex")
        parallel = self._parallel(w.numel.times(w.rnumel))
        if vec is None:
            return [*scalar.hoisted, *parallel, *loop("xindex", 0, w.numel, 1, scalar.lines)]
        end = w.numel.round_down(w.lanes)
        lines = [*vec.hoisted, *parallel, *loop("xindex", 0, end, w.lanes, vec.lines)]
        if end != w.numel.text:
            lines += [*scalar.hoisted, *loop("xindex", end, w.numel, 1, scalar.lines)]
        return lines

    def _row_period(self) -> int | None:
        """The row length of a 2-D loop nest for this pointwise kernel, if it needs one.

        A loop over rows of ``C`` elements with a vectorized loop over columns (and a
        scalar tail per row) serves two cases. Some load is not contiguous along
        ``xindex`` because rows do not fill whole vectors (a bias over rows of 100, a
        batch-norm channel of 14x14 pixels): in rows it is contiguous or broadcast again.
        Or every load already is, but some value depends on the row only (a channel's
        batch-norm scale): it is then computed once per row, not once per vector.
        """
        w = self.w
        numel = w.numel.static
        if numel is None:
            return None
        indices = [sizes.merge_digits(i) for n in w.group.nodes for i in load_indices(n)]
        flat = all(_unit_or_broadcast(i, XINDEX, w.lanes) for i in indices)
        digits = [
            m
            for index in indices
            for m in sympy.sympify(index).atoms(FloorDiv, ModularIndexing)
            if m.args[0] == XINDEX and m.args[1].is_Integer
        ]
        periods = {int(m.args[1]) for m in digits if m.args[1] != 1}
        if not flat:
            periods |= {
                int(m.args[2])
                for m in digits
                if isinstance(m, ModularIndexing) and m.args[1] == 1 and m.args[2].is_Integer
            }
        for c in sorted(periods):
            # The scalar tail of each row must stay a small part of it.
            if numel % c or c < w.lanes or c % w.lanes > c // 4 or (c % w.lanes == 0) != flat:
                continue
            if flat and (c < ROW_MIN_LANES * w.lanes or numel // c < ROW_MIN_ROWS):
                continue  # too little per row to hoist, or too few rows to share out
            return c
        return None

    def _pointwise_rows(self, period: int) -> list[str] | None:
        w = self.w
        assert w.numel.static is not None
        rows = w.numel.static // period
        w.index_ranges = {_ROW: rows, _COL: period}
        try:
            run = functools.partial(w.run_nodes, w.group.nodes, period * _ROW + _COL)
            vec = w.vector_pass(run, Extent(sympy.Integer(period)), _COL)
            if vec is None:
                return None
            scalar = w.scalar_pass(run, _COL.name) if period % w.lanes else None
        finally:
            w.index_ranges = {}
        end = period - period % w.lanes
        inner = [*vec.hoisted, *loop(_COL.name, 0, end, w.lanes, vec.lines)]
        if scalar is not None:
            inner += [*scalar.hoisted, *loop(_COL.name, end, period, 1, scalar.lines)]
        return [*self._parallel(w.numel), *loop(_ROW.name, 0, rows, 1, inner)]

    def _symbolic_period(self) -> sympy.Expr | None:
        """The longest symbolic row length along which every load is contiguous or
        broadcast (a channel's plane), else the shortest, which every other is a
        multiple of (an image row: a pooling window's gathers stay within it)."""
        w = self.w
        indices = [i for n in w.group.nodes for i in load_indices(n)]
        periods = symbolic_periods(w.group.numel, indices)
        for c in periods:
            split = (split_index(i, c, _ROW, _COL, w.group.numel) for i in indices)
            if all(_unit_or_broadcast(i, _COL, w.lanes) for i in split):
                return c
        if periods and all(quotient(c, periods[-1]) is not None for c in periods):
            return periods[-1]
        return None

    def _symbolic_rows(self, period: sympy.Expr) -> list[str] | None:
        """Rows of ``period`` elements (a symbolic size, see ``symbolic_rows``), each a
        vectorized loop over its columns with a scalar tail."""
        w = self.w
        rows = quotient(w.group.numel, period)
        assert rows is not None
        columns = Extent(period)
        w.index_split = (period, _ROW, _COL, w.group.numel)
        try:
            run = functools.partial(w.run_nodes, w.group.nodes, XINDEX)
            vec = w.vector_pass(run, columns, _COL)
            if vec is None:
                return None
            scalar = w.scalar_pass(run, _COL.name)
        finally:
            w.index_split = None
        end = columns.round_down(w.lanes)
        inner = [*vec.hoisted, *loop(_COL.name, 0, end, w.lanes, vec.lines)]
        inner += [*scalar.hoisted, *loop(_COL.name, end, columns, 1, scalar.lines)]
        return [*self._parallel(None), *loop(_ROW.name, 0, Extent(rows), 1, inner)]

    # -- reductions -------------------------------------------------------------------
    def _reduction(self) -> list[str]:
        w = self.w
        work = w.numel.times(w.rnumel)
        split_r = (
            work is not None
            and work.at_least(PARALLEL_MIN_WORK)
            and w.numel.below(SPLIT_REDUCTION_MAX_NUMEL)
        )
        rows_start = "0"
        lines: list[str] = []
        if not split_r and self._prefers_row_lanes():
            step = w.lanes * (ROW_UNROLL if w.numel.at_least(2 * ROW_UNROLL * w.lanes) else 1)
            rows = w.vector_pass(functools.partial(self._row_lanes_body, step), w.numel, XINDEX)
            if rows is not None:
                rows_start = w.numel.round_down(step)
                lines += [*rows.hoisted, *self._parallel(work)]
                lines += loop("xindex", 0, rows_start, step, rows.lines)
        if rows_start == w.numel.text:
            return lines
        cache = None if split_r else w.row_cache
        inner = [] if cache is None else cache.declarations()
        for ordinal, part in enumerate(split_segments(w.group.nodes)):
            if isinstance(part, Segment):
                if cache is not None:
                    cache.segment = ordinal
                try:
                    inner += self._segment_block(part, split_r)
                finally:
                    if cache is not None:
                        cache.segment = -1
            else:
                inner += w.scalar_pass(functools.partial(w.run_nodes, [part], XINDEX)).lines
        pragma = [] if split_r else self._parallel(work)
        return [*lines, *pragma, *loop("xindex", rows_start, w.numel, 1, inner)]

    def _prefers_row_lanes(self) -> bool:
        """True when some load strides along ``rindex`` but every load is contiguous in ``xindex``."""
        w = self.w
        if w.numel.below(w.lanes):
            return False
        strided_r = False
        for node in w.group.nodes:
            for index in load_indices(node):
                along_x = lane_analysis.lane_access(index, XINDEX, w.lanes)
                if along_x is None or along_x.stride not in (0, 1):
                    return False
                along_r = lane_analysis.lane_access(index, RINDEX, w.lanes)
                strided_r |= along_r is None or along_r.stride not in (0, 1)
        return strided_r

    def _row_lanes_body(self, step: int) -> None:
        """``step`` rows as vectors: scalar ``rindex`` loops over vector values.

        Several vectors side by side give each row's loop independent chains and
        whole cache lines; node bodies take ``xindex + k*lanes`` for the k-th.
        """
        w = self.w
        starts = [XINDEX + k for k in range(0, step, w.lanes)]
        for part in split_segments(w.group.nodes):
            if not isinstance(part, Segment):
                for start in starts:
                    w.run_nodes([part], start)
                continue
            part.row_lanes = True
            w.segment = part

            def run(part: Segment = part) -> None:
                part.start_pass()
                for start in starts:
                    w.run_nodes(part.nodes, start, RINDEX)

            try:
                body = w.nested_lines(run, "rindex")
            finally:
                w.segment = None
            block = [line for acc in part.accumulators for line in acc.declarations()]
            block += [*body.hoisted, *loop("rindex", 0, w.rnumel, 1, body.lines)]
            block += part.final_stores
            w.emit_lines(_block(block))

    def _segment_block(self, segment: Segment, split_r: bool) -> list[str]:
        """One row's reduction loop over ``rindex``: accumulators, loop(s), folds, stores."""
        w = self.w
        w.segment = segment
        try:
            run = functools.partial(w.run_segment, segment)
            vec = w.vector_pass(run, w.rnumel, RINDEX)
            if vec is None:
                segment.reset()  # forget the failed vector pass's accumulators
                if w.row_cache is not None:
                    w.row_cache.valid = False  # its loop stores nothing another could load
            scalar = w.scalar_pass(run, "rindex")
            for code in (vec, scalar) if w.row_cache is not None else ():
                if code is not None:
                    code.lines = drop_unused(code.lines, "")
                    code.hoisted = drop_unused(code.hoisted, "\n".join(code.lines))
        finally:
            w.segment = None
        accs = segment.accumulators
        if split_r:
            lines = self._split_reduction(accs, vec, scalar)
        else:
            lines = [line for acc in accs for line in acc.declarations()]
            lines += self._r_loops("0", w.rnumel.text, vec, scalar, accs)
            lines += [line for acc in accs for line in acc.fold_lanes()]
        return _block([*lines, *segment.final_stores])

    def _r_loops(
        self, start: str, end: str, vec: Code | None, scalar: Code, accs: list[Accumulator]
    ) -> list[str]:
        """Hoisted invariants, the vector loop over whole vectors of [start, end),
        then the scalar rest."""
        lanes = self.w.lanes
        if vec is None:
            return [*scalar.hoisted, *loop("rindex", start, end, 1, scalar.lines)]
        static = start == "0" and end.isdigit()
        vec_end = str(int(end) - int(end) % lanes) if static else "rvec_end"
        lines = [*vec.hoisted]
        if not static:
            lines.append(f"const int64_t rvec_end = {end} - ({end} - {start}) % {lanes};")
        flushes = [line for acc in accs for line in acc.cascade_flush()]
        if flushes and not self.w.rnumel.below(2 * CASCADE_BLOCK):
            # Long float sums: add blocks of CASCADE_BLOCK elements separately, then the
            # block sums, so rounding error grows with the block count, not the length.
            inner = [
                f"const int64_t rblock_end = kiln::imin(rblock + {CASCADE_BLOCK}, {vec_end});",
                *loop("rindex", "rblock", "rblock_end", lanes, vec.lines),
                *flushes,
            ]
            lines += [line for acc in accs for line in acc.cascade_declarations()]
            lines += loop("rblock", start, vec_end, CASCADE_BLOCK, inner)
            lines += [line for acc in accs for line in acc.cascade_finish()]
        else:
            lines += loop("rindex", start, vec_end, lanes, vec.lines)
        if vec_end != end:
            lines += [*scalar.hoisted, *loop("rindex", vec_end, end, 1, scalar.lines)]
        return lines

    def _split_reduction(
        self, accs: list[Accumulator], vec: Code | None, scalar: Code
    ) -> list[str]:
        """Chunks of ``rindex`` reduced by parallel threads, merged in chunk order.

        Chunk starts are multiples of the lane count, which the vector loop's
        index analysis assumes; merging in order keeps results deterministic.
        """
        rnumel, lanes = self.w.rnumel, self.w.lanes
        lines = [line for acc in accs for line in acc.declarations(with_vector=False)]
        lines += [
            f"const int64_t rchunk = (({rnumel} + nthreads - 1) / nthreads + "
            f"{lanes - 1}) / {lanes} * {lanes};",
            f"const int64_t nchunks = ({rnumel} + rchunk - 1) / rchunk;",
            *(line for acc in accs for line in acc.partial_arrays("nchunks")),
        ]
        body = [
            "const int64_t rstart = chunk * rchunk;",
            f"const int64_t rend = kiln::imin(rstart + rchunk, {rnumel});",
            *(line for acc in accs for line in acc.declarations()),
            *self._r_loops("rstart", "rend", vec, scalar, accs),
            *(line for acc in accs for line in acc.fold_lanes()),
            *(line for acc in accs for line in acc.save_partial("chunk")),
        ]
        lines += [_PARALLEL_FOR, *loop("chunk", "0", "nchunks", 1, body)]
        merges = [line for acc in accs for line in acc.merge_partial("chunk")]
        if merges:
            lines += loop("chunk", "0", "nchunks", 1, merges)
        return lines


def _unit_or_broadcast(index: sympy.Expr, var: sympy.Symbol, lanes: int) -> bool:
    access = lane_analysis.lane_access(index, var, lanes)
    return access is not None and access.stride in (0, 1)
