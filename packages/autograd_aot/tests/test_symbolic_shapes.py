"""Graphs whose inputs have symbolic sizes: compiled once, right at every size they admit.

The graphs are built by hand as capture builds them: placeholders whose ``meta["val"]`` is a
fake with symbolic sizes (``symbolic_meta``), sizes the program reads as ``aten.sym_size.int``
nodes with ``operator`` arithmetic over them, torch functions as ``call_function`` nodes.
Each call's sizes satisfy the shape environment's guards (checked), as the frame's guards
would ensure; the outputs and gradients are compared with the graph run eagerly.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from kiln.autograd_aot import aot_eager, aot_eager_decomp_partition
from kiln.capture import capture, counters
from kiln.capture.dynamic_dims import DynamicDims, dynamic_dims
from kiln.capture.meta import FakeTensor
from kiln.capture.shapes import ShapeEnv, create_symint, failing_guards, symbolic_meta
from kiln.capture.source import LocalSource

aten = torch.ops.aten
Body = Callable[[fx.Graph, list[fx.Node]], Sequence[fx.Node]]


def _graph(
    examples: Sequence[torch.Tensor],
    dynamic: Sequence[Sequence[int]],
    body: Body,
    root: torch.nn.Module | None = None,
) -> tuple[fx.GraphModule, ShapeEnv]:
    """A capture-like graph over ``examples``: input ``i``'s dims ``dynamic[i]`` symbolic."""
    env = ShapeEnv()
    graph = fx.Graph()
    inputs = []
    for i, (t, dims) in enumerate(zip(examples, dynamic, strict=True)):
        node = graph.placeholder(f"x{i}")
        meta = symbolic_meta(t, LocalSource(f"x{i}"), env, dynamic_dims=dims)
        node.meta["val"] = FakeTensor(meta, t.device, requires_grad=t.requires_grad)
        inputs.append(node)
    graph.output(tuple(body(graph, inputs)))
    return fx.GraphModule(root or torch.nn.Module(), graph), env


def _size(graph: fx.Graph, x: fx.Node, d: int) -> fx.Node:
    return graph.call_function(aten.sym_size.int, (x, d))


def _values(env: ShapeEnv, inputs: Sequence[torch.Tensor]) -> dict:
    return {
        s: int(info.source.resolve({f"x{i}": t for i, t in enumerate(inputs)}, {}, {}))
        for s, info in env.symbols.items()
    }


def _clone(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in ts]


def _check(
    gm: fx.GraphModule,
    env: ShapeEnv,
    calls: Sequence[Sequence[torch.Tensor]],
    backend: Callable = aot_eager,
    grad: bool = False,
) -> None:
    """Compile with ``calls[0]``, run every call; one program traced for them all."""
    before = counters.snapshot().get("autograd_aot", {}).get("programs", 0)
    compiled = backend(gm, _clone(calls[0]))
    for inputs in calls:
        assert not failing_guards(env, _values(env, inputs)), [t.shape for t in inputs]
        mine, theirs = _clone(inputs), _clone(inputs)
        got, expect = compiled(*mine), gm(*theirs)
        torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-5)
        if grad:
            weights = [torch.randn_like(t) for t in expect]
            sum((o * w).sum() for o, w in zip(got, weights, strict=True)).backward()
            sum((o * w).sum() for o, w in zip(expect, weights, strict=True)).backward()
            for a, b in zip(mine, theirs, strict=True):
                if b.requires_grad:
                    torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
    after = counters.snapshot().get("autograd_aot", {}).get("programs", 0)
    assert len(compiled.variants()) == 1
    assert after - before == 1


def _view_body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
    (x,) = xs
    b, s = _size(graph, x, 0), _size(graph, x, 1)
    bs = graph.call_function(operator.mul, (b, s))
    flat = graph.call_function(torch.Tensor.view, (x, bs, 8))
    half = graph.call_function(operator.floordiv, (s, 2))
    back = graph.call_function(torch.reshape, (flat, (b, s, 2, 4)))
    rows = graph.call_function(torch.narrow, (back, 1, 0, half))
    return [
        graph.call_function(torch.sin, (flat,)),
        graph.call_function(torch.mul, (back, 2)),
        graph.call_function(torch.sum, (rows, 1)),
    ]


@pytest.mark.parametrize("grad", [False, True])
def test_view_reshape_and_size_arithmetic(grad: bool) -> None:
    sizes = [(3, 5), (4, 7), (2, 9), (6, 4)]
    calls = [[torch.randn(b, s, 8, requires_grad=grad)] for b, s in sizes]
    gm, env = _graph(calls[0], [(0, 1)], _view_body)
    _check(gm, env, calls, grad=grad)


def _attention_body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
    x, w = xs
    b, s = _size(graph, x, 0), _size(graph, x, 1)
    h = graph.call_function(F.linear, (x, w))  # (b, s, 16)
    heads = graph.call_function(torch.Tensor.view, (h, b, s, 2, 8))
    q = graph.call_function(torch.transpose, (heads, 1, 2))
    scores = graph.call_function(
        torch.matmul, (q, graph.call_function(torch.transpose, (q, -1, -2)))
    )
    probs = graph.call_function(torch.softmax, (scores, -1))
    ctx = graph.call_function(torch.matmul, (probs, q))
    merged = graph.call_function(
        torch.reshape, (graph.call_function(torch.transpose, (ctx, 1, 2)), (b, s, -1))
    )
    normed = graph.call_function(F.layer_norm, (merged, (16,)))
    return [normed, graph.call_function(torch.sum, (normed, 1))]


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
@pytest.mark.parametrize("grad", [False, True])
def test_attention_block(backend: Callable, grad: bool) -> None:
    w = torch.randn(16, 8, requires_grad=grad)
    sizes = [(2, 5), (3, 9), (4, 3), (2, 12)]
    calls = [[torch.randn(b, s, 8, requires_grad=grad), w] for b, s in sizes]
    gm, env = _graph(calls[0], [(0, 1), ()], _attention_body)
    _check(gm, env, calls, backend, grad=grad)


def _conv_body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
    x, w = xs
    y = graph.call_function(F.conv2d, (x, w), {"padding": 1})
    y = graph.call_function(F.relu, (y,))
    n = _size(graph, y, 0)
    flat = graph.call_function(torch.Tensor.view, (y, n, -1))
    return [graph.call_function(torch.mean, (flat, -1)), y]


@pytest.mark.parametrize("grad", [False, True])
def test_conv2d_at_several_image_sizes(grad: bool) -> None:
    w = torch.randn(4, 3, 3, 3, requires_grad=grad)
    sizes = [(2, 8, 10), (3, 12, 7), (2, 5, 5)]
    calls = [[torch.randn(n, 3, h, ww, requires_grad=grad), w] for n, h, ww in sizes]
    gm, env = _graph(calls[0], [(0, 2, 3), ()], _conv_body)
    _check(gm, env, calls, aot_eager_decomp_partition, grad=grad)


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)


def test_module_parameters_with_symbolic_inputs() -> None:
    root = _Linear()

    def body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
        (x,) = xs
        w = graph.get_attr("lin.weight")
        bias = graph.get_attr("lin.bias")
        y = graph.call_function(F.linear, (x, w, bias))
        return [graph.call_function(torch.sum, (y, 0))]

    calls = [[torch.randn(n, 8)] for n in (3, 6, 11)]
    gm, env = _graph(calls[0], [(0,)], body, root)
    compiled = aot_eager(gm, calls[0])
    for (x,) in calls:
        expect = gm(x)[0]
        got = compiled(x)[0]
        torch.testing.assert_close(got, expect)
        expect.sum().backward()
        grad_e = root.lin.weight.grad.clone()
        root.lin.weight.grad = None
        got.sum().backward()
        torch.testing.assert_close(root.lin.weight.grad, grad_e)
        root.lin.weight.grad = None
    assert len(compiled.variants()) == 1


def test_static_graph_traces_as_before() -> None:
    def body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
        return [graph.call_function(torch.softmax, (xs[0], -1))]

    x = torch.randn(3, 4)
    gm, _ = _graph([x], [()], body)
    compiled = aot_eager(gm, [x])
    code = compiled.variants()[0].forward.code
    assert "sym_size" not in code
    torch.testing.assert_close(compiled(x)[0], torch.softmax(x, -1))


def _alias_body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
    (x,) = xs
    b, s = _size(graph, x, 0), _size(graph, x, 1)
    flat = graph.call_function(torch.Tensor.view, (x, graph.call_function(operator.mul, (b, s)), 8))
    tail = graph.call_function(torch.narrow, (x, 1, 1, graph.call_function(operator.sub, (s, 1))))
    summed = graph.call_function(torch.sum, (x, 1, True))
    wide = graph.call_function(torch.Tensor.expand, (summed, b, s, 8))
    return [flat, tail, wide, graph.call_function(operator.mul, (s, 2))]


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_views_of_inputs_and_sizes_as_outputs(backend: Callable) -> None:
    """Views of inputs are rebuilt outside the graph with this call's sizes; a returned size
    is this call's; a backward for the one output that gets a gradient."""
    calls = [[torch.randn(b, s, 8, requires_grad=True)] for b, s in [(3, 5), (4, 7), (2, 9)]]
    gm, env = _graph(calls[0], [(0, 1)], _alias_body)
    compiled = backend(gm, _clone(calls[0]))
    for inputs in calls:
        assert not failing_guards(env, _values(env, inputs))
        (mine,), (theirs,) = _clone(inputs), _clone(inputs)
        got, expect = compiled(mine), gm(theirs)
        assert got[3] == expect[3] and isinstance(got[3], int)
        torch.testing.assert_close(got[:3], expect[:3])
        assert got[0]._base is mine and got[1]._base is mine
        (got[2] * 2).sum().backward()
        (expect[2] * 2).sum().backward()
        torch.testing.assert_close(mine.grad, theirs.grad)
    assert len(compiled.variants()) == 1


def test_mutated_symbolic_input() -> None:
    def body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
        x, y = xs
        graph.call_function(torch.Tensor.add_, (x, y))
        return [graph.call_function(torch.sum, (x, 0))]

    calls = [[torch.randn(n, 8), torch.randn(n, 8)] for n in (3, 5, 9)]
    gm, env = _graph(calls[0], [(0,), (0,)], body)
    compiled = aot_eager(gm, _clone(calls[0]))
    for inputs in calls:
        mine, theirs = _clone(inputs), _clone(inputs)
        torch.testing.assert_close(compiled(*mine), gm(*theirs))
        torch.testing.assert_close(mine, theirs)
    assert len(compiled.variants()) == 1


class _TwoOutputs(torch.autograd.Function):
    """A backward node that takes both outputs' gradients at once: the pruned backward gives
    the missing one zeros, of symbolic size."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x * 3

    @staticmethod
    def backward(ctx: object, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a, b]).sum(0) * 5


def two_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _TwoOutputs.apply(x)


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_pruned_backward_with_symbolic_zeros(backend: Callable) -> None:
    def body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
        pair = graph.call_function(two_outputs, (graph.call_function(torch.sin, (xs[0],)),))
        return [graph.call_function(operator.getitem, (pair, i)) for i in (0, 1)]

    calls = [[torch.randn(b, s, 8, requires_grad=True)] for b, s in [(3, 6), (4, 8), (2, 10)]]
    gm, env = _graph(calls[0], [(0, 1)], body)
    compiled = backend(gm, _clone(calls[0]))
    pruned = counters.snapshot().get("autograd_aot", {}).get("pruned_backwards", 0)
    for inputs in calls:
        (mine,), (theirs,) = _clone(inputs), _clone(inputs)
        got, expect = compiled(mine), gm(theirs)
        torch.testing.assert_close(got, expect)
        (got[1] * 2).sum().backward()
        (expect[1] * 2).sum().backward()
        torch.testing.assert_close(mine.grad, theirs.grad)
    assert counters.snapshot()["autograd_aot"]["pruned_backwards"] == pruned + 1
    assert len(compiled.variants()) == 1


class _Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(4)


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_batch_norm_training_updates_statistics(backend: Callable) -> None:
    """Running statistics (mutated buffers) follow eager's at every size; the decomposed
    update's unbiased factor ``n / (n - 1)`` is a float over sizes, computed in the graph."""
    root, ref = _Norm(), _Norm()

    def body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
        names = ("running_mean", "running_var", "weight", "bias")
        mean, var, weight, bias = (graph.get_attr(f"bn.{n}") for n in names)
        y = graph.call_function(F.batch_norm, (xs[0], mean, var, weight, bias, True))
        return [graph.call_function(torch.relu, (y,))]

    calls = [[torch.randn(n, 4, h, w)] for n, h, w in [(2, 5, 6), (3, 7, 9), (5, 4, 11)]]
    gm, env = _graph(calls[0], [(0, 2, 3)], body, root)
    compiled = backend(gm, _clone(calls[0]))
    for (x,) in calls:
        assert not failing_guards(env, _values(env, [x]))
        got, expect = compiled(x)[0], ref.bn(x).relu()
        torch.testing.assert_close(got, expect)
        got.pow(2).sum().backward()
        expect.pow(2).sum().backward()
        torch.testing.assert_close(root.bn.running_mean, ref.bn.running_mean)
        torch.testing.assert_close(root.bn.running_var, ref.bn.running_var)
        torch.testing.assert_close(root.bn.weight.grad, ref.bn.weight.grad, rtol=1e-3, atol=1e-4)
    assert len(compiled.variants()) == 1


def test_captured_training_step_at_several_sizes() -> None:
    """Kiln's own capture with every size symbolic: one program serves every size."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 2)
    )
    reference = copy.deepcopy(model)

    def step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        y = model(x).reshape(b * s, -1)
        return y.sum(), y

    before = counters.snapshot().get("autograd_aot", {}).get("programs", 0)
    x = torch.randn(3, 5, 4, requires_grad=True)
    with dynamic_dims(DynamicDims(every_size=True)):
        result = capture(
            step,
            (model, x),
            {},
            compile_graph=aot_eager_decomp_partition,
            wrap_callable=lambda f: f,
        )
    for shape in [(3, 5, 4), (4, 7, 4), (2, 9, 4)]:
        x = torch.randn(*shape, requires_grad=True)
        got = result.function(model, x)
        got[0].backward()
        grad_x, x.grad = x.grad, None
        expect = step(reference, x)
        expect[0].backward()
        torch.testing.assert_close(got, expect)
        torch.testing.assert_close(grad_x, x.grad)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    assert counters.snapshot()["autograd_aot"]["programs"] == before + 1


def _scale_body(graph: fx.Graph, xs: list[fx.Node]) -> list[fx.Node]:
    (x,) = xs
    d = _size(graph, x, 2)
    root = graph.call_function(operator.pow, (d, 0.5))
    inverse = graph.call_function(operator.truediv, (1, d))
    return [
        graph.call_function(operator.truediv, (x, root)),
        graph.call_function(operator.mul, (x, inverse)),
    ]


@pytest.mark.parametrize("grad", [False, True])
def test_float_factors_of_sizes(grad: bool) -> None:
    """``x / d ** 0.5`` and ``x * (1 / d)``: float expressions over sizes, computed in the graph."""
    calls = [[torch.randn(2, b, d, requires_grad=grad)] for b, d in [(3, 4), (5, 9), (4, 16)]]
    gm, env = _graph(calls[0], [(1, 2)], _scale_body)
    _check(gm, env, calls, aot_eager_decomp_partition, grad=grad)


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_symbolic_number_input(backend: Callable) -> None:
    """A Python int the graph takes as a symbolic number (capture's SymInt placeholder) is a
    graph input of the program, bound per call: one program for every value."""
    env = ShapeEnv()
    x0 = torch.randn(3, 8, requires_grad=True)
    graph = fx.Graph()
    x = graph.placeholder("x0")
    x.meta["val"] = FakeTensor(
        symbolic_meta(x0, LocalSource("x0"), env), x0.device, requires_grad=True
    )
    n = graph.placeholder("n")
    n.meta["val"] = create_symint(env, 5, LocalSource("n"))
    head = graph.call_function(torch.narrow, (x, 1, 0, n))
    scaled = graph.call_function(torch.mul, (graph.call_function(torch.sin, (head,)), n))
    graph.output((scaled, graph.call_function(operator.add, (n, 1))))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    compiled = backend(gm, [x0, 5])
    for (b, d), count in [((3, 8), 5), ((4, 10), 3), ((6, 7), 7)]:
        x_in = torch.randn(b, d, requires_grad=True)
        (mine,), (theirs,) = _clone([x_in]), _clone([x_in])
        got, expect = compiled(mine, count), gm(theirs, count)
        torch.testing.assert_close(got[0], expect[0])
        assert got[1] == count + 1
        got[0].sum().backward()
        expect[0].sum().backward()
        torch.testing.assert_close(mine.grad, theirs.grad)
    assert len(compiled.variants()) == 1
