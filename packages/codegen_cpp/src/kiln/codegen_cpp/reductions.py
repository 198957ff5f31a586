"""C++ for reduction accumulators: declarations, per-element updates, final folds.

A reduction loop has a scalar accumulator and, when the loop is vectorized, a
vector one per lane. Both start at the reduction's identity; after the loop the
lanes are folded in order into the scalar (``kiln_reduce.h``), which then holds
the result that ``store_reduction`` writes. Accumulators live in the compute
type (float for bfloat16/float16 results), so long sums keep their precision.
"""

from __future__ import annotations

import dataclasses

import torch

from kiln.codegen_cpp.dtypes import compute_ctype, vector_ctype
from kiln.codegen_cpp.ops import CannotVectorize, CppVar
from kiln.codegen_cpp.printer import cpp_float_literal

__all__ = ["Accumulator"]

_SIMPLE_UPDATE: dict[str, tuple[str, str]] = {
    # reduction type: (scalar update, vector update) of accumulator {a} by value {x}
    "sum": ("{a} = {a} + {x};", "{a} = {a} + {x};"),
    "prod": ("{a} = {a} * {x};", "{a} = {a} * {x};"),
    "max": ("{a} = kiln::scalar_max({a}, {x});", "{a} = kiln::maximum({a}, {x});"),
    "min": ("{a} = kiln::scalar_min({a}, {x});", "{a} = kiln::minimum({a}, {x});"),
    "any": ("{a} = {a} || {x};", "{a} = {a} | {x};"),
    "xor_sum": ("{a} = {a} ^ {x};", "{a} = {a} ^ {x};"),
}
_LANE_FOLD: dict[str, str] = {
    "sum": "{a} = {a} + kiln::reduce_sum({v});",
    "prod": "{a} = {a} * kiln::reduce_prod({v});",
    "max": "{a} = kiln::scalar_max(kiln::reduce_max({v}), {a});",
    "min": "{a} = kiln::scalar_min(kiln::reduce_min({v}), {a});",
    "any": "{a} = {a} || {v}.any();",
    "xor_sum": "{a} = {a} ^ kiln::reduce_xor({v});",
}


def _identity(reduction_type: str, dtype: torch.dtype) -> str:
    ctype = compute_ctype(dtype)
    if reduction_type in ("sum", "xor_sum", "welford_reduce"):
        return "false" if dtype == torch.bool else f"static_cast<{ctype}>(0)"
    if reduction_type == "prod":
        return f"static_cast<{ctype}>(1)"
    if reduction_type == "any":
        return "false"
    is_max = reduction_type in ("max", "argmax")
    if dtype.is_floating_point:
        return cpp_float_literal(-float("inf") if is_max else float("inf"), ctype)
    if dtype == torch.bool:
        return "false" if is_max else "true"
    bound = "lowest" if is_max else "max"
    return f"std::numeric_limits<{ctype}>::{bound}()"


@dataclasses.dataclass
class Accumulator:
    """One reduction of a loop: named ``acc<N>``, with ``acc<N>_vec`` when vectorized."""

    name: str
    reduction_type: str
    dtype: torch.dtype  # the accumulator's (result's, for argmax the values')
    vectorized: bool = False
    row_lanes: bool = False  # each lane its own row: vector accumulators only, never folded

    @property
    def _fields(self) -> tuple[str, ...]:
        if self.reduction_type == "welford_reduce":
            return ("mean", "m2", "weight")
        if self.reduction_type in ("argmax", "argmin"):
            return ("val", "idx")
        return ("",)

    def _var(self, field: str, vector: bool) -> str:
        name = f"{self.name}_{field}" if field else self.name
        return f"{name}_vec" if vector else name

    def _ctype(self, field: str, vector: bool) -> str:
        dtype = torch.int64 if field == "idx" else self.dtype
        if self.reduction_type == "any":
            dtype = torch.bool
        return vector_ctype(dtype) if vector else compute_ctype(dtype)

    def declarations(self, with_vector: bool = True) -> list[str]:
        """Lines that declare and initialise the scalar (and vector) accumulators."""
        lines = []
        variants = (False, True) if self.vectorized and with_vector else (False,)
        for vector in (True,) if self.row_lanes else variants:
            for field in self._fields:
                init = "0" if field == "idx" else _identity(self.reduction_type, self.dtype)
                ctype = self._ctype(field, vector)
                value = f"{ctype}({init})" if vector else init
                lines.append(f"{ctype} {self._var(field, vector)} = {value};")
        return lines

    def update(self, value: CppVar | tuple[CppVar, CppVar], vector: bool) -> str:
        """The line folding one element (one vector of elements) into the accumulator."""
        rtype = self.reduction_type
        if rtype in ("argmax", "argmin"):
            assert isinstance(value, tuple)
            is_max = "true" if rtype == "argmax" else "false"
            val, idx = (self._var(f, vector) for f in self._fields)
            return f"kiln::arg_update<{is_max}>({val}, {idx}, {value[0]}, {value[1]});"
        assert isinstance(value, CppVar)
        if rtype == "welford_reduce":
            mean, m2, weight = (self._var(f, vector) for f in self._fields)
            v_type = self._ctype("mean", vector)
            return (
                f"kiln::welford_update<{v_type}, {compute_ctype(self.dtype)}>"
                f"({mean}, {m2}, {weight}, {value});"
            )
        if vector and self.dtype == torch.bool and rtype != "any":
            raise CannotVectorize(f"{rtype} over bool")
        scalar, vec = _SIMPLE_UPDATE[rtype]
        return (vec if vector else scalar).format(a=self._var("", vector), x=value)

    def fold_lanes(self) -> list[str]:
        """After the loops: fold the vector lanes into the scalar accumulator."""
        if not self.vectorized or self.row_lanes:
            return []
        rtype = self.reduction_type
        if rtype in ("argmax", "argmin"):
            is_max = "true" if rtype == "argmax" else "false"
            return [
                f"kiln::arg_lanes<{is_max}>({self.name}_val, {self.name}_idx, "
                f"{self.name}_val_vec, {self.name}_idx_vec);"
            ]
        if rtype == "welford_reduce":
            args = ", ".join(self._var(f, v) for v in (False, True) for f in self._fields)
            return [f"kiln::welford_lanes({args});"]
        return [_LANE_FOLD[rtype].format(a=self.name, v=f"{self.name}_vec")]

    @property
    def _cascades(self) -> bool:
        return (
            self.vectorized
            and not self.row_lanes
            and (self.reduction_type == "sum" and self.dtype.is_floating_point)
        )

    def cascade_declarations(self) -> list[str]:
        """The running total of block sums (long vectorized float sums only)."""
        if not self._cascades:
            return []
        ctype = self._ctype("", True)
        return [f"{ctype} {self.name}_total = {ctype}({_identity('sum', self.dtype)});"]

    def cascade_flush(self) -> list[str]:
        """After each block: add the block's lanes to the total and restart them."""
        if not self._cascades:
            return []
        vec, ctype = self._var("", True), self._ctype("", True)
        return [
            f"{self.name}_total = {self.name}_total + {vec};",
            f"{vec} = {ctype}({_identity('sum', self.dtype)});",
        ]

    def cascade_finish(self) -> list[str]:
        return [f"{self._var('', True)} = {self.name}_total;"] if self._cascades else []

    def partial_arrays(self, count: str) -> list[str]:
        """Per-chunk result arrays of a reduction split across threads."""
        return [
            f"kiln::Scratch<{self._ctype(f, False)}> {self._var(f, False)}_part({count});"
            for f in self._fields
        ]

    def save_partial(self, chunk: str) -> list[str]:
        return [
            f"{self._var(f, False)}_part[{chunk}] = {self._var(f, False)};" for f in self._fields
        ]

    def merge_partial(self, chunk: str) -> list[str]:
        """Fold chunk ``chunk``'s result into the accumulator (chunks in order)."""
        parts = [f"{self._var(f, False)}_part[{chunk}]" for f in self._fields]
        mine = [self._var(f, False) for f in self._fields]
        rtype = self.reduction_type
        if rtype in ("argmax", "argmin"):
            is_max = "true" if rtype == "argmax" else "false"
            return [f"kiln::arg_merge<{is_max}>({mine[0]}, {mine[1]}, {parts[0]}, {parts[1]});"]
        if rtype == "welford_reduce":
            return [f"kiln::welford_merge({', '.join(mine + parts)});"]
        scalar, _ = _SIMPLE_UPDATE[rtype]
        return [scalar.format(a=mine[0], x=parts[0])]

    def results(self) -> CppVar | tuple[CppVar, ...]:
        """The finished values, valid after :meth:`fold_lanes` (vectors for row lanes)."""
        vec = self.row_lanes
        if self.reduction_type == "welford_reduce":
            return tuple(CppVar(self._var(f, vec), self.dtype) for f in self._fields)
        if self.reduction_type in ("argmax", "argmin"):
            return CppVar(self._var("idx", vec), torch.int64)
        dtype = torch.bool if self.reduction_type == "any" else self.dtype
        return CppVar(self._var("", vec), dtype)
