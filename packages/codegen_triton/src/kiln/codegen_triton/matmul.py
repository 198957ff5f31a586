"""A Triton matmul template with a fused pointwise epilogue (``max_autotune``).

``C = epilogue(A @ B, extras...)``: the template tiles M and N (grouped launch
order for L2 reuse), accumulates in float32 over K, then applies the consumer's
pointwise epilogue to the accumulator tile before the single store, so e.g.
``relu(x @ w + b)`` is one kernel instead of a library call plus a pointwise
kernel. :func:`pick_matmul` times the template against the vendor library
(``torch.mm`` plus the eager epilogue) on the GPU and keeps whichever is faster.

loopir lowers ``mm`` to an extern call today and its backend protocol has no
hook for templates, so this is driven directly (``TritonMatmul``) until it does.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

from kiln.codegen_triton.config import options
from kiln.codegen_triton.module_cache import MODULE_HEADER, load_module, write_module
from kiln.codegen_triton.ops import triton_type
from kiln.codegen_triton.timing import bench_ms

__all__ = ["Epilogue", "TritonMatmul", "pick_matmul", "MATMUL_CONFIGS"]

log = logging.getLogger("kiln.codegen_triton.autotune")

MATMUL_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
    (128, 128, 32, 8, 3),
    (64, 128, 32, 4, 4),
    (128, 64, 64, 4, 3),
    (64, 64, 32, 4, 2),
)

_TEMPLATE = """
@triton.jit
def {name}(a_ptr, b_ptr, c_ptr, {extra_params}M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % width) // group_size
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                    (rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    (kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
{extra_loads}    out = {expr}
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, out.to({out_type}), mask)
"""

_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """Pointwise work on the accumulator: ``expr`` over ``acc`` and ``e0, e1, ...``.

    Extra operand ``i`` is read at ``row * strides[i][0] + col * strides[i][1]``
    (a stride of 0 broadcasts: ``(0, 1)`` is a bias over columns). ``eager`` is the
    same computation in torch, used by the vendor-library path.
    """

    expr: str = "acc"
    strides: tuple[tuple[int, int], ...] = ()
    eager: Callable[..., torch.Tensor] = lambda acc, *extras: acc


class TritonMatmul:
    """One compiled template for an epilogue and output dtype."""

    def __init__(self, epilogue: Epilogue, out_dtype: torch.dtype = torch.float32) -> None:
        self.epilogue = epilogue
        self.out_dtype = out_dtype
        self.name = f"kiln_mm{next(_ids)}"
        self.source = MODULE_HEADER + _render(self.name, epilogue, out_dtype)
        path = write_module(options.cache_dir, self.source, self.name)
        self.kernel: Any = getattr(load_module(path), self.name)

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, *extras: torch.Tensor,
        config: Sequence[int] = MATMUL_CONFIGS[0],
    ) -> torch.Tensor:  # fmt: skip
        (m, k), (_, n) = a.shape, b.shape
        out = torch.empty((m, n), dtype=self.out_dtype, device=a.device)
        bm, bn, bk, warps, stages = config
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        self.kernel[grid](
            a, b, out, *extras, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            out.stride(0), out.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        return out

    def vendor(self, a: torch.Tensor, b: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:
        """The library path the template competes with."""
        return self.epilogue.eager(torch.mm(a, b).float(), *extras).to(self.out_dtype)


def _render(name: str, epilogue: Epilogue, out_dtype: torch.dtype) -> str:
    params = "".join(f"e{i}_ptr, " for i in range(len(epilogue.strides)))
    loads = "".join(
        f"    e{i} = tl.load(e{i}_ptr + rm[:, None] * {sr} + rn[None, :] * {sc}, mask,"
        f" other=0.0).to(tl.float32)\n"
        for i, (sr, sc) in enumerate(epilogue.strides)
    )
    return _TEMPLATE.format(
        name=name, extra_params=params, extra_loads=loads, expr=epilogue.expr,
        out_type=triton_type(out_dtype),
    )  # fmt: skip


def pick_matmul(
    mm: TritonMatmul, a: torch.Tensor, b: torch.Tensor, *extras: torch.Tensor
) -> Callable[..., torch.Tensor]:
    """The faster of the template's configs and the vendor library, timed on these operands."""
    timings: dict[str, float] = {"vendor": bench_ms(lambda: mm.vendor(a, b, *extras))}
    best_cfg: Sequence[int] = MATMUL_CONFIGS[0]
    for cfg in MATMUL_CONFIGS:
        try:
            t = bench_ms(functools.partial(mm, a, b, *extras, config=cfg))
        except Exception as exc:  # a config the device cannot hold loses
            log.info("matmul config %s failed: %s", cfg, exc)
            continue
        if t < timings.get("template", float("inf")):
            timings["template"], best_cfg = t, cfg
    log.info("matmul %s timings (ms): %s", mm.name, timings)
    if timings.get("template", float("inf")) < timings["vendor"]:
        return lambda *args: mm(*args, config=best_cfg)
    return mm.vendor
