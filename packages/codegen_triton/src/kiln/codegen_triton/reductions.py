"""Reductions in Triton: persistent (one block holds the row) or looped (accumulators).

A persistent reduction masks the ``[XBLOCK, RBLOCK]`` tile and reduces axis 1
in one call. A looped one keeps an accumulator per lane across the ``roffset``
loop and folds the lanes after it. Both keep dims (results are ``[XBLOCK, 1]``)
so they broadcast against the tile. Float max/min propagate NaN and
argmax/argmin pick the first index among ties, as in eager; variance uses
Welford (two-pass inside one block, per-lane Welford across loop iterations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kiln.codegen_triton.errors import TritonCodegenError
from kiln.codegen_triton.ops import CSEVar, TritonOps, literal, triton_type

if TYPE_CHECKING:
    from kiln.codegen_triton.kernel import TritonKernel

__all__ = ["Reductions"]

_BIG_INDEX = "9223372036854775807"


def _lowest(dtype: torch.dtype, highest: bool = False) -> str:
    if dtype.is_floating_point:
        return literal(float("inf") if highest else float("-inf"), dtype)
    if dtype == torch.bool:
        return literal(highest, dtype)
    info = torch.iinfo(dtype)
    return str(info.max if highest else info.min)


def _init(rtype: str, dtype: torch.dtype) -> str:
    if rtype in ("max", "argmax"):
        return _lowest(dtype)
    if rtype in ("min", "argmin"):
        return _lowest(dtype, highest=True)
    if rtype == "prod":
        return literal(1, dtype)
    return literal(0, dtype)


# persistent: fold a masked tile along axis 1, keeping dims
_FOLD = {
    "sum": "tl.sum({v}, 1)[:, None]",
    "prod": "kh.prod_last({v})",
    "xor_sum": "kh.xor_last({v})",
}
# looped: combine the accumulator with one tile
_COMBINE = {
    "sum": "{acc} + {v}",
    "prod": "{acc} * {v}",
    "xor_sum": "{acc} ^ {v}",
}


class Reductions:
    """Emits the reductions of one kernel (``ops.reduction``)."""

    def __init__(self, kernel: TritonKernel) -> None:
        self.k = kernel

    def reduce(self, dtype: torch.dtype, rtype: str, value: Any) -> Any:
        key = ("reduction", rtype, dtype, str(value))
        found = self.k.scopes[0].get(key)
        if found is not None:
            return found
        ops = TritonOps(self.k)
        mask = self.k.full_mask()
        if rtype in ("argmax", "argmin"):
            result: Any = self._arg(rtype, dtype, value[0], value[1], mask)
        elif rtype == "welford_reduce":
            result = self._welford(ops.to_dtype(value, dtype), mask)
        elif rtype == "any":
            flag = ops.to_dtype(value, torch.bool)
            result = ops.to_dtype(self._any(flag, mask), dtype)
        elif rtype in ("max", "min"):
            result = self._minmax(rtype, ops.to_dtype(value, dtype), mask)
        elif rtype in _FOLD:
            result = self._simple(rtype, ops.to_dtype(value, dtype), mask)
        else:
            msg = f"Triton backend has no reduction {rtype!r}"
            raise TritonCodegenError(msg)
        self.k.scopes[0][key] = result
        return result

    # -- helpers for both styles --
    def _acc(self, rtype: str, dtype: torch.dtype, init: str | None = None) -> str:
        """A ``[XBLOCK, RBLOCK]`` accumulator declared before the open loop."""
        assert self.k.loop is not None
        name = self.k.new_name("_acc")
        fill = init if init is not None else _init(rtype, dtype)
        self.k.loop.pre.append(f"{name} = tl.full([XBLOCK, RBLOCK], {fill}, {triton_type(dtype)})")
        return name

    def _after(self, expr: str, dtype: torch.dtype) -> CSEVar:
        """A value computed after the open loop (visible to every later node)."""
        assert self.k.loop is not None
        var = CSEVar(self.k.new_name(), dtype)
        self.k.loop.post.append(f"{var} = {expr}")
        return var

    def _simple(self, rtype: str, v: CSEVar, mask: str) -> CSEVar:
        init = _init(rtype, v.dtype)
        if self.k.persistent:
            return self.k.cse(_FOLD[rtype].format(v=f"tl.where({mask}, {v}, {init})"), v.dtype)
        acc = self._acc(rtype, v.dtype)
        combined = _COMBINE[rtype].format(acc=acc, v=v)
        self.k.emit(f"{acc} = tl.where({mask}, {combined}, {acc})")
        return self._after(_FOLD[rtype].format(v=acc), v.dtype)

    def _minmax(self, rtype: str, v: CSEVar, mask: str) -> CSEVar:
        floating = v.dtype.is_floating_point
        fold = f"kh.{rtype}_last({{v}})" if floating else f"tl.{rtype}({{v}}, 1)[:, None]"
        init = _init(rtype, v.dtype)
        if self.k.persistent:
            return self.k.cse(fold.format(v=f"tl.where({mask}, {v}, {init})"), v.dtype)
        acc = self._acc(rtype, v.dtype)
        fn = f"kh.{'maximum' if rtype == 'max' else 'minimum'}" if floating else f"tl.{rtype}imum"
        self.k.emit(f"{acc} = tl.where({mask}, {fn}({acc}, {v}), {acc})")
        return self._after(fold.format(v=acc), v.dtype)

    def _any(self, flag: CSEVar, mask: str) -> CSEVar:
        if self.k.persistent:
            tile = f"tl.where({mask}, {flag}, 0).to(tl.int8)"
            return self.k.cse(f"tl.max({tile}, 1)[:, None] != 0", torch.bool)
        acc = self._acc("any", torch.int8)
        self.k.emit(f"{acc} = tl.where({mask}, {acc} | {flag}.to(tl.int8), {acc})")
        return self._after(f"tl.max({acc}, 1)[:, None] != 0", torch.bool)

    def _arg(self, rtype: str, dtype: torch.dtype, v: CSEVar, idx: CSEVar, mask: str) -> CSEVar:
        init = _init(rtype, v.dtype)
        if self.k.persistent:
            vals = f"tl.where({mask}, {v}, {init})"
            where = f"tl.where({mask}, {idx}, {_BIG_INDEX})"
            out = self.k.cse(f"kh.{rtype}_last({vals}, {where})", torch.int64)
        else:
            acc_v = self._acc(rtype, v.dtype)
            acc_i = self._acc(rtype, torch.int64, _BIG_INDEX)
            new_v, new_i = self.k.new_name("_v"), self.k.new_name("_i")
            self.k.emit(f"{new_v}, {new_i} = kh.{rtype}_combine({acc_v}, {acc_i}, {v}, {idx})")
            self.k.emit(f"{acc_v} = tl.where({mask}, {new_v}, {acc_v})")
            self.k.emit(f"{acc_i} = tl.where({mask}, {new_i}, {acc_i})")
            out = self._after(f"kh.{rtype}_last({acc_v}, {acc_i})", torch.int64)
        if dtype == torch.int64:
            return out
        if self.k.persistent:
            return TritonOps(self.k).to_dtype(out, dtype)
        return self._after(f"{out}.to({triton_type(dtype)})", dtype)

    def _welford(self, v: CSEVar, mask: str) -> tuple[CSEVar, CSEVar, CSEVar]:
        d = v.dtype
        if self.k.persistent:
            cse = self.k.cse
            weight = cse(f"tl.sum(tl.where({mask}, 1.0, 0.0), 1)[:, None].to({triton_type(d)})", d)
            total = cse(f"tl.sum(tl.where({mask}, {v}, 0.0), 1)[:, None]", d)
            mean = cse(f"{total} / {weight}", d)
            dev = cse(f"tl.where({mask}, {v} - {mean}, 0.0)", d)
            m2 = cse(f"tl.sum({dev} * {dev}, 1)[:, None]", d)
            return mean, m2, weight
        accs = [self._acc("sum", d) for _ in range(3)]
        new = [self.k.new_name("_w") for _ in range(3)]
        self.k.emit(f"{', '.join(new)} = kh.welford_update({', '.join(accs)}, {v})")
        for acc, fresh in zip(accs, new, strict=True):
            self.k.emit(f"{acc} = tl.where({mask}, {fresh}, {acc})")
        names = [CSEVar(self.k.new_name(), d) for _ in range(3)]
        assert self.k.loop is not None
        self.k.loop.post.append(
            f"{', '.join(map(str, names))} = kh.welford_last({', '.join(accs)})"
        )
        return names[0], names[1], names[2]
