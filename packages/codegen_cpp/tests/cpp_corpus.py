"""Hand-built loopir kernel groups for the C++ backend's differential tests.

Each :class:`Case` is a :class:`KernelGroup` and a recipe for fresh random inputs;
tests run it through the C++ backend and through loopir's reference backend
(which defines what a kernel computes) and compare the outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import sympy
import torch

from kiln.loopir import sizes
from kiln.loopir.ir.buffers import ComputedBuffer, InputBuffer, MutationBuffer
from kiln.loopir.ir.layout import Layout, contiguous_layout
from kiln.loopir.ir.loops import Pointwise, Reduction, Scatter
from kiln.loopir.kernel import KernelGroup, KernelNode

CPU = torch.device("cpu")
S = sympy.Integer


def layout(dtype: torch.dtype, size: Sequence[int], stride: Sequence[int] | None = None) -> Layout:
    if stride is None:
        return contiguous_layout(CPU, dtype, [S(s) for s in size], flexible=False)
    return Layout(CPU, dtype, tuple(S(s) for s in size), tuple(S(s) for s in stride))


def inp(
    name: str, dtype: torch.dtype, size: Sequence[int], stride: Sequence[int] | None = None
) -> InputBuffer:
    return InputBuffer(name, layout(dtype, size, stride))


def pointwise(
    name: str,
    dtype: torch.dtype,
    size: Sequence[int],
    fn: Callable,
    origin: str = "pw",
    stride: Sequence[int] | None = None,
) -> ComputedBuffer:
    ranges = tuple(S(s) for s in size)
    return ComputedBuffer(
        name, layout(dtype, size, stride), Pointwise(CPU, dtype, ranges, origin, fn)
    )


def reduction(
    name: str,
    dtype: torch.dtype,
    size: Sequence[int],
    rsize: Sequence[int],
    rtype: str,
    src_dtype: torch.dtype,
    fn: Callable,
    output_index: int | None = None,
) -> ComputedBuffer:
    data = Reduction(
        CPU,
        dtype,
        tuple(S(s) for s in size),
        rtype,
        tuple(S(s) for s in rsize),
        rtype,
        src_dtype,
        fn,
        output_index,
    )
    return ComputedBuffer(name, layout(dtype, size), data)


def scatter(
    name: str,
    target: InputBuffer | ComputedBuffer,
    size: Sequence[int],
    fn: Callable,
    out_index: Callable,
    mode: str | None,
) -> MutationBuffer:
    data = Scatter(
        CPU, target.layout.dtype, tuple(S(s) for s in size), "scatter", fn, out_index, mode
    )
    return MutationBuffer(name, target.layout, data, target.name)


@dataclasses.dataclass
class Case:
    name: str
    group: KernelGroup
    make_inputs: Callable[[], list[torch.Tensor]]
    atol: float | None = None
    rtol: float | None = None


def group(
    name: str,
    inputs: Sequence[InputBuffer],
    nodes: Sequence[tuple[ComputedBuffer, str]],
    numel: int,
    rnumel: int = 1,
    outputs: Sequence[str] | None = None,
) -> KernelGroup:
    layouts = {b.name: b.layout for b in inputs}
    for buf, _ in nodes:
        layouts[buf.storage_name()] = buf.layout
    knodes = tuple(KernelNode(buf, mode, S(rnumel)) for buf, mode in nodes)  # type: ignore[arg-type]
    out_names = (
        tuple(outputs)
        if outputs is not None
        else tuple(dict.fromkeys(buf.storage_name() for buf, _ in nodes))
    )
    in_names = tuple(b.name for b in inputs if b.name not in out_names)
    return KernelGroup(name, CPU, S(numel), S(rnumel), knodes, layouts, in_names, out_names)


def split_args(
    g: KernelGroup, values: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A case's values: the group's inputs, then initial contents of mutated outputs."""
    return values[: len(g.inputs)], values[len(g.inputs) :]


def outputs_for(g: KernelGroup, initial: Sequence[torch.Tensor] = ()) -> list[torch.Tensor]:
    """Fresh output tensors (filled with 7s) in the group's layouts; mutated ones cloned."""
    outs = [t.clone() for t in initial]
    for name in g.outputs[len(initial) :]:
        lay = g.buffers[name]
        size = [sizes.evaluate_int(s) for s in lay.size]
        stride = [sizes.evaluate_int(s) for s in lay.stride]
        t = torch.empty_strided(size, stride, dtype=lay.dtype)
        outs.append(t.fill_(0) if lay.dtype == torch.bool else t.fill_(7))
    return outs


def random_tensor(
    dtype: torch.dtype,
    size: Sequence[int],
    kind: str = "normal",
    stride: Sequence[int] | None = None,
) -> torch.Tensor:
    """Non-zero random data of a given flavour, optionally in a strided storage."""
    n = 1
    for s in size:
        n *= s
    if kind == "positive":
        base = torch.rand(n, dtype=torch.float64) * 4 + 0.1
    elif kind == "unit":
        base = torch.rand(n, dtype=torch.float64) * 1.8 - 0.9
    elif kind == "int":
        base = torch.randint(-20, 20, (n,)).to(torch.float64)
    elif kind == "small_int":
        base = torch.randint(1, 6, (n,)).to(torch.float64)
    elif kind == "bool":
        base = (torch.rand(n) > 0.5).to(torch.float64)
    else:
        base = torch.randn(n, dtype=torch.float64) * 2
    t = base.to(dtype).reshape(size)
    if stride is not None:
        out = torch.empty_strided(size, stride, dtype=dtype)
        out.copy_(t)
        return out
    return t
