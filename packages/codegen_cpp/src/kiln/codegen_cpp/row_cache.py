"""Values that several ``rindex`` loops of one row compute, computed once.

Softmax's three loops over a row each compute ``exp(x - max)``; softmax followed by
layer norm computes it in four. Loopir inlines those values into each reduction that
reads them, so the kernel writer sees the same expression again in every loop. The
kernel is therefore generated twice. The first time records, for each loop of the
row (a segment), the vector values it computes inside the loop, keyed by what they
compute: the expression with each operand replaced by the operand's own key (vector
values of the vector loop and scalar ones of its tail are recorded apart). The
second time, a value involving an expensive op (exp, log, tanh...) that an
earlier loop of the row already computed is loaded from a row-sized array on the
stack, which that loop stores, instead of being recomputed. Only the largest such
values are loaded; what they were computed from becomes dead code, dropped.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from kiln.codegen_cpp.dtypes import compute_ctype, vector_ctype

__all__ = ["ROW_CACHE_BYTES", "RowCache", "drop_unused"]

ROW_CACHE_BYTES = 32768
"""Stack bytes per thread for the row arrays (they stay in the L1 cache)."""

_TMP = re.compile(r"\btmp\d+\b")
_EXPENSIVE = re.compile(
    r"kiln::(exp|log|tanh|sigmoid|erf|sin|cos|map|map2|from_lanes)\b|std::(exp|log|tanh|erf)"
)
_DECLARATION = re.compile(r"(?:auto|const [\w:]+) (tmp\d+) = ")


@dataclasses.dataclass
class _Value:
    operands: frozenset[int]
    expensive: bool  # it or something it is computed from
    dtype: torch.dtype


class RowCache:
    """Records values per segment (first generation), then plans and applies loads."""

    def __init__(self, rnumel: int, tail: bool) -> None:
        self.rnumel = rnumel
        self.tail = tail  # rnumel is not whole vectors: the scalar tail loops share values too
        self.segment = -1
        """Which loop of the row is being generated; -1 outside them (nothing recorded)."""
        self.valid = True  # a loop that did not vectorize turns sharing off
        self._ids: dict[str, int] = {}  # canonical text -> key
        self._values: list[_Value] = []
        self._keys: dict[str, int] = {}  # C++ variable -> key
        # (segment, vectorized) -> keys computed in its loop, in order
        self._computed: dict[tuple[int, bool], list[int]] = {}
        self._stores: dict[tuple[int, int], str] = {}  # (segment, key) -> array
        self._loads: dict[tuple[int, int], str] = {}
        self._arrays: dict[str, str] = {}  # array -> element type

    def value(
        self, var: str, expr: str, dtype: torch.dtype, in_loop: bool, vectorized: bool
    ) -> tuple[str, str]:
        """``(expression, line after it)`` for ``var = expr``: a load from the row's array
        where planned, a store into it where planned, else ``(expr, "")``."""
        text = _TMP.sub(lambda m: f"#{self._keys.get(m.group(0), m.group(0))}", expr)
        key = self._ids.setdefault(text, len(self._ids))
        if key == len(self._values):
            operands = frozenset(self._keys[n] for n in _TMP.findall(expr) if n in self._keys)
            expensive = bool(_EXPENSIVE.search(expr)) or any(
                self._values[k].expensive for k in operands
            )
            self._values.append(_Value(operands, expensive, dtype))
        self._keys[var] = key
        if self.segment < 0 or not in_loop or not (vectorized or self.tail):
            return expr, ""
        self._computed.setdefault((self.segment, vectorized), []).append(key)
        array = self._loads.get((self.segment, key))
        if array is not None:
            load = f"{vector_ctype(dtype)}::loadu({array} + rindex)"
            return (load if vectorized else f"{array}[rindex]"), ""
        array = self._stores.get((self.segment, key))
        if array is None:
            return expr, ""
        return expr, (
            f"{var}.store({array} + rindex);" if vectorized else f"{array}[rindex] = {var};"
        )

    def plan(self) -> bool:
        """Decide loads and stores from what the first generation recorded (True: some)."""
        if not self.valid:
            return False
        first: dict[int, int] = {}
        budget = ROW_CACHE_BYTES
        # Each kind (vector loop, scalar tail) in loop order; their keys never coincide.
        for segment, vectorized in sorted(self._computed, key=lambda sv: (sv[1], sv[0])):
            keys = self._computed[(segment, vectorized)]
            shared = {k for k in keys if k in first and self._values[k].expensive}
            inner = {op for k in shared for op in self._values[k].operands}
            for key in dict.fromkeys(k for k in keys if k in shared - inner):
                dtype = self._values[key].dtype
                if dtype == torch.bool:
                    continue
                array = f"row{key}"
                if array not in self._arrays:
                    if self.rnumel * 8 > budget:  # 8: the widest element
                        continue
                    budget -= self.rnumel * 8
                    self._arrays[array] = compute_ctype(dtype)
                    self._stores[(first[key], key)] = array
                self._loads[(segment, key)] = array
            for key in keys:
                first.setdefault(key, segment)
        self._ids.clear()
        self._values.clear()
        self._keys.clear()
        self._computed.clear()
        return bool(self._loads)

    def declarations(self) -> list[str]:
        """The row arrays, declared in the body of the loop over rows (one per thread)."""
        return [f"alignas(64) {t} {a}[{self.rnumel}];" for a, t in self._arrays.items()]


def drop_unused(lines: list[str], uses: str) -> list[str]:
    """``lines`` without the vector values nothing reads (not ``uses``, not other lines):
    what a loaded value was computed from."""
    while True:
        text = "\n".join([*lines, uses])
        dead = {
            m.group(1)
            for line in lines
            if (m := _DECLARATION.match(line)) and len(re.findall(rf"\b{m.group(1)}\b", text)) == 1
        }
        if not dead:
            return lines
        lines = [
            line for line in lines if not ((m := _DECLARATION.match(line)) and m.group(1) in dead)
        ]
