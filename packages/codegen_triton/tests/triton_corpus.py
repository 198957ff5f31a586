"""Hand-built loopir kernel groups, run through the Triton backend and the reference backend.

loopir's reference backend defines what a kernel computes; a case passes when
the Triton kernel (under the interpreter, or on a GPU) writes the same outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import sympy
import torch

from kiln.codegen_triton import TritonBackend
from kiln.loopir import sizes
from kiln.loopir.ir.buffers import ComputedBuffer, InputBuffer
from kiln.loopir.ir.layout import Layout, contiguous_layout
from kiln.loopir.ir.loops import Pointwise, Reduction
from kiln.loopir.kernel import KernelGroup, KernelNode
from kiln.loopir.reference import ReferenceBackend

DEVICE = torch.device("cpu")
S = sympy.Integer


def layout(dtype: torch.dtype, size: Sequence[int], stride: Sequence[int] | None = None) -> Layout:
    if stride is None:
        return contiguous_layout(DEVICE, dtype, [S(s) for s in size], flexible=False)
    return Layout(DEVICE, dtype, tuple(S(s) for s in size), tuple(S(s) for s in stride))


def inp(name: str, dtype: torch.dtype, size: Sequence[int], stride=None) -> InputBuffer:
    return InputBuffer(name, layout(dtype, size, stride))


def pointwise(name, dtype, size, fn, stride=None) -> ComputedBuffer:
    ranges = tuple(S(s) for s in size)
    return ComputedBuffer(
        name, layout(dtype, size, stride), Pointwise(DEVICE, dtype, ranges, "pw", fn)
    )


def reduction(name, dtype, size, rsize, rtype, src_dtype, fn, output_index=None) -> ComputedBuffer:
    data = Reduction(
        DEVICE, dtype, tuple(S(s) for s in size), rtype, tuple(S(s) for s in rsize),
        rtype, src_dtype, fn, output_index,
    )  # fmt: skip
    return ComputedBuffer(name, layout(dtype, size), data)


def group(name, inputs, nodes, numel, rnumel=1) -> KernelGroup:
    layouts = {b.name: b.layout for b in inputs}
    for buf, _ in nodes:
        layouts[buf.storage_name()] = buf.layout
    knodes = tuple(KernelNode(buf, mode, S(rnumel)) for buf, mode in nodes)
    outs = tuple(dict.fromkeys(buf.storage_name() for buf, _ in nodes))
    ins = tuple(b.name for b in inputs if b.name not in outs)
    return KernelGroup(name, DEVICE, S(numel), S(rnumel), knodes, layouts, ins, outs)


@dataclasses.dataclass
class Case:
    name: str
    group: KernelGroup
    make_inputs: Callable[[], list[torch.Tensor]]
    atol: float | None = None
    rtol: float | None = None


def random_tensor(dtype: torch.dtype, size: Sequence[int], kind: str = "normal") -> torch.Tensor:
    """Non-zero random data of a flavour (domain-restricted for log, asin, ...)."""
    if kind == "positive":
        base = torch.rand(size, dtype=torch.float64) * 4 + 0.1
    elif kind == "unit":
        base = torch.rand(size, dtype=torch.float64) * 1.8 - 0.9
    elif kind == "above_one":
        base = torch.rand(size, dtype=torch.float64) * 4 + 1.1
    elif kind == "int":
        base = torch.randint(-20, 20, size).to(torch.float64)
        base = torch.where(base == 0, torch.ones_like(base), base)
    elif kind == "shift":
        base = torch.randint(0, 7, size).to(torch.float64)
    elif kind == "bool":
        base = (torch.rand(size) > 0.5).to(torch.float64)
    else:
        base = torch.randn(size, dtype=torch.float64) * 2
    return base.to(dtype)


def _outputs(g: KernelGroup, device: str) -> list[torch.Tensor]:
    outs = []
    for name in g.outputs:
        lay = g.buffers[name]
        size = [sizes.evaluate_int(s) for s in lay.size]
        stride = [sizes.evaluate_int(s) for s in lay.stride]
        outs.append(torch.empty_strided(size, stride, dtype=lay.dtype, device=device).fill_(0))
    return outs


def run_case(case: Case, backend: TritonBackend | None = None, device: str = "cpu") -> None:
    """Both backends on the same fresh inputs; outputs must match."""
    inputs = [t.to(device) for t in case.make_inputs()]
    case = dataclasses.replace(
        case, group=dataclasses.replace(case.group, device=torch.device(device))
    )
    expected = _outputs(case.group, device)
    actual = _outputs(case.group, device)
    ReferenceBackend().codegen_kernel(case.group).fn(*inputs, *expected)
    (backend or TritonBackend()).codegen_kernel(case.group).fn(*inputs, *actual)
    for name, a, e in zip(case.group.outputs, actual, expected, strict=True):
        if name in case.group.internal:
            continue  # nothing after the kernel reads it: the Triton kernel may skip it
        torch.testing.assert_close(a, e, atol=case.atol, rtol=case.rtol, equal_nan=True)
