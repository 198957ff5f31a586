"""Helpers for testing lowerings and code generators against eager and the reference backend.

Two kinds of test share them. Program tests trace a plain function of ATen (or torch)
calls into a graph with meta values (:func:`aten_graph`), compile it through loopir with a
chosen backend and compare with eager (:func:`check`). Kernel tests build one
:class:`~kiln.loopir.kernel.KernelGroup` by hand (:func:`inp`, :func:`pointwise`,
:func:`reduction`, :func:`scatter`, :func:`group`), and a code generator's kernel for it must
write what the reference backend's does on fresh :func:`random_tensor` inputs. A backend
author's tests use them as loopir's own and Kiln's code generators' do; an index printer's
text is checked against sympy's value with :func:`eval_index`.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx

from kiln.loopir import sizes
from kiln.loopir.backend import Backend
from kiln.loopir.ir.buffers import ComputedBuffer, InputBuffer, MutationBuffer
from kiln.loopir.ir.layout import Layout, contiguous_layout
from kiln.loopir.ir.loops import Pointwise, Reduction, Scatter
from kiln.loopir.kernel import KernelGroup, KernelNode
from kiln.loopir.pipeline import CompiledGraph, compile_graph
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.wrapper import clone_strided

__all__ = [
    "CPU",
    "Case",
    "Input",
    "aten_graph",
    "check",
    "check_calls",
    "compile_fn",
    "eval_index",
    "fill_meta",
    "graph_of_calls",
    "group",
    "inp",
    "layout",
    "outputs_for",
    "pointwise",
    "random_tensor",
    "reduction",
    "scatter",
    "split_args",
    "to_meta",
]

CPU = torch.device("cpu")

# -- programs ------------------------------------------------------------------------------


def to_meta(t: Any) -> Any:
    """A meta tensor with ``t``'s sizes, strides and dtype; anything else as it is."""
    if isinstance(t, torch.Tensor):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def fill_meta(gm: torch.fx.GraphModule, metas: Sequence[Any]) -> None:
    """Run ``gm`` on meta values, recording each node's value in ``meta["val"]`` as capture
    and autograd_aot do."""

    class Fill(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op == "get_attr":
                result = to_meta(result)
            n.meta["val"] = result
            return result

    Fill(gm).run(*metas)


def aten_graph(fn: Callable[..., Any], *inputs: Any) -> torch.fx.GraphModule:
    """``fn`` (ATen or torch-level calls) traced, a meta ``meta["val"]`` on every node."""
    gm = torch.fx.symbolic_trace(fn)
    fill_meta(gm, [to_meta(t) for t in inputs])
    return gm


def _examples(inputs: Sequence[Any]) -> list[Any]:
    # meta tensors carry no device: real CUDA tensors tell loopir where kernels run
    return [t if getattr(t, "is_cuda", False) else to_meta(t) for t in inputs]


def compile_fn(
    fn: Callable[..., Any], *inputs: Any, backend: Backend | None = None
) -> CompiledGraph:
    """``fn`` traced and compiled by loopir with ``backend`` (the reference one by default)."""
    gm = aten_graph(fn, *inputs)
    return compile_graph(gm, _examples(inputs), backend=backend or ReferenceBackend())


def _clones(inputs: Sequence[Any]) -> list[Any]:
    return [clone_strided(t) if isinstance(t, torch.Tensor) else t for t in inputs]


def check(
    fn: Callable[..., Any],
    *inputs: Any,
    atol: float | None = None,
    rtol: float | None = None,
    equal_nan: bool = True,
    backend: Backend | None = None,
) -> CompiledGraph:
    """Compile ``fn``, run it, and compare with eager on copies of the same inputs (so a
    program that writes its inputs is compared on the values both runs start from)."""
    compiled = compile_fn(fn, *inputs, backend=backend)
    expected = fn(*_clones(inputs))
    actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
    return compiled


@dataclasses.dataclass(frozen=True)
class Input:
    """A placeholder of :func:`graph_of_calls`: the ``i``-th input."""

    i: int


def graph_of_calls(
    n_inputs: int, calls: Sequence[tuple[Any, Sequence[Any], dict[str, Any]]]
) -> torch.fx.GraphModule:
    """A graph calling each ``(op, args, kwargs)`` (:class:`Input` names a placeholder) and
    returning every result: for ops that take no tensor, which tracing would fold away."""
    g = torch.fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n_inputs)]
    outs = []
    for op, args, kwargs in calls:
        node_args = [xs[a.i] if isinstance(a, Input) else a for a in args]
        outs.append(g.call_function(op, tuple(node_args), kwargs))
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def check_calls(
    calls: Sequence[tuple[Any, Sequence[Any], dict[str, Any]]],
    *inputs: Any,
    backend: Backend | None = None,
    **tol: Any,
) -> CompiledGraph:
    """:func:`graph_of_calls` compiled and compared with eager (``tol`` as ``assert_close``)."""
    gm = graph_of_calls(len(inputs), calls)
    metas = [to_meta(t) for t in inputs]
    fill_meta(gm, metas)
    compiled = compile_graph(gm, metas, backend=backend or ReferenceBackend())
    torch.testing.assert_close(compiled(*inputs), gm(*inputs), **tol)
    return compiled


# -- kernel groups -------------------------------------------------------------------------

S = sympy.Integer


def layout(
    dtype: torch.dtype,
    size: Sequence[int],
    stride: Sequence[int] | None = None,
    device: torch.device = CPU,
) -> Layout:
    """A fixed layout: contiguous, or with the given strides."""
    if stride is None:
        return contiguous_layout(device, dtype, [S(s) for s in size], flexible=False)
    return Layout(device, dtype, tuple(S(s) for s in size), tuple(S(s) for s in stride))


def inp(
    name: str, dtype: torch.dtype, size: Sequence[int], stride: Sequence[int] | None = None
) -> InputBuffer:
    """An input buffer of a kernel group."""
    return InputBuffer(name, layout(dtype, size, stride))


def pointwise(
    name: str,
    dtype: torch.dtype,
    size: Sequence[int],
    fn: Callable[..., Any],
    origin: str = "pw",
    stride: Sequence[int] | None = None,
) -> ComputedBuffer:
    """A buffer computed elementwise by ``fn`` (index → value through ``ops``)."""
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
    fn: Callable[..., Any],
    output_index: int | None = None,
) -> ComputedBuffer:
    """A buffer reducing ``fn`` (index, reduction index → value) over ``rsize``."""
    ranges, rranges = tuple(S(s) for s in size), tuple(S(s) for s in rsize)
    data = Reduction(CPU, dtype, ranges, rtype, rranges, rtype, src_dtype, fn, output_index)
    return ComputedBuffer(name, layout(dtype, size), data)


def scatter(
    name: str,
    target: InputBuffer | ComputedBuffer,
    size: Sequence[int],
    fn: Callable[..., Any],
    out_index: Callable[..., Any],
    mode: str | None,
) -> MutationBuffer:
    """A write of ``fn``'s values into ``target`` at ``out_index`` (``mode``: None or an
    accumulation such as ``"atomic_add"``)."""
    ranges = tuple(S(s) for s in size)
    data = Scatter(CPU, target.layout.dtype, ranges, "scatter", fn, out_index, mode)
    return MutationBuffer(name, target.layout, data, target.name)


def group(
    name: str,
    inputs: Sequence[InputBuffer],
    nodes: Sequence[tuple[ComputedBuffer, str]],
    numel: int,
    rnumel: int = 1,
    outputs: Sequence[str] | None = None,
) -> KernelGroup:
    """One kernel over ``nodes`` (each with its mode: ``"pointwise"``, ``"reduction"`` ...);
    its outputs are every node's buffer unless ``outputs`` names them."""
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


@dataclasses.dataclass
class Case:
    """A kernel group and a recipe for fresh inputs, with the tolerance its outputs need."""

    name: str
    group: KernelGroup
    make_inputs: Callable[[], list[torch.Tensor]]
    atol: float | None = None
    rtol: float | None = None


def split_args(
    g: KernelGroup, values: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A case's values: the group's inputs, then initial contents of mutated outputs."""
    return values[: len(g.inputs)], values[len(g.inputs) :]


def outputs_for(
    g: KernelGroup,
    initial: Sequence[torch.Tensor] = (),
    device: torch.device | str = CPU,
    fill: float = 7,
) -> list[torch.Tensor]:
    """Fresh output tensors in the group's layouts, filled with ``fill`` (booleans with
    False), so a kernel that skips an element shows; mutated ones cloned from ``initial``."""
    outs = [clone_strided(t) for t in initial]
    for name in g.outputs[len(initial) :]:
        lay = g.buffers[name]
        size = [sizes.evaluate_int(s) for s in lay.size]
        stride = [sizes.evaluate_int(s) for s in lay.stride]
        t = torch.empty_strided(size, stride, dtype=lay.dtype, device=device)
        outs.append(t.fill_(0) if lay.dtype == torch.bool else t.fill_(fill))
    return outs


def _random_base(kind: str, n: int) -> torch.Tensor:
    if kind == "positive":
        return torch.rand(n, dtype=torch.float64) * 4 + 0.1
    if kind == "unit":
        return torch.rand(n, dtype=torch.float64) * 1.8 - 0.9
    if kind == "above_one":
        return torch.rand(n, dtype=torch.float64) * 4 + 1.1
    if kind == "int":
        base = torch.randint(-20, 20, (n,)).to(torch.float64)
        return torch.where(base == 0, torch.ones_like(base), base)
    if kind == "small_int":
        return torch.randint(1, 6, (n,)).to(torch.float64)
    if kind == "shift":
        return torch.randint(0, 7, (n,)).to(torch.float64)
    if kind == "bool":
        return (torch.rand(n) > 0.5).to(torch.float64)
    return torch.randn(n, dtype=torch.float64) * 2


def random_tensor(
    dtype: torch.dtype,
    size: Sequence[int],
    kind: str = "normal",
    stride: Sequence[int] | None = None,
) -> torch.Tensor:
    """Random data of a flavour, in a strided storage if ``stride`` is given. ``kind``:
    ``normal``; ``positive`` and ``unit`` (domains of log, asin...); ``above_one`` (acosh);
    ``int`` (never 0, so divisions are defined); ``small_int`` (1 to 5); ``shift`` (0 to 6,
    shift amounts); ``bool``."""
    t = _random_base(kind, sizes.evaluate_int(sizes.product(size))).to(dtype).reshape(size)
    if stride is None:
        return t
    out = torch.empty_strided(size, stride, dtype=dtype)
    out.copy_(t)
    return out


# -- index printers ------------------------------------------------------------------------


def _trunc_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


class _Truncating(ast.NodeTransformer):
    """``/``, ``//`` and ``%`` as calls that round toward zero, as C's and Triton's do."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            return ast.Call(ast.Name("_tdiv", ast.Load()), [node.left, node.right], [])
        if isinstance(node.op, ast.Mod):
            return ast.Call(ast.Name("_tmod", ast.Load()), [node.left, node.right], [])
        return node


def eval_index(
    text: str,
    env: dict[str, int],
    names: dict[str, Any] | None = None,
    *,
    truncating: bool = False,
) -> int:
    """The value of printed index arithmetic, evaluated as Python, at the point ``env``
    (symbol name to value). ``names`` are the dialect's functions (``min``/``max`` are
    given); ``truncating`` gives ``/``, ``//`` and ``%`` the integer semantics of C and
    Triton (toward zero), so a dialect's floor helpers are checked where they matter."""
    tree = ast.parse(text, mode="eval")
    if truncating:
        tree = ast.fix_missing_locations(_Truncating().visit(tree))
    scope: dict[str, Any] = {
        "min": min,
        "max": max,
        "_tdiv": _trunc_div,
        "_tmod": lambda a, b: a - _trunc_div(a, b) * b,
        **(names or {}),
    }
    return int(eval(compile(tree, "<index>", "eval"), scope, dict(env)))
