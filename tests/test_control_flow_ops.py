"""``torch.cond`` and ``torch.while_loop`` in one compiled graph, against eager.

Each program runs several times on fresh inputs whose predicate flips between calls, under
``fullgraph=True`` with each backend (``eager`` runs capture's graph, ``aot_eager`` its ATen
graphs, ``kiln`` the compiled ones); outputs and the gradients of inputs and parameters must
be eager's, with one graph and no recompile when only the predicate's value changes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

import kiln
from kiln.capture.control_flow import CondCall, WhileLoopCall
from kiln.capture.errors import Unsupported

BACKENDS = ["eager", "aot_eager", "kiln"]
needs_while_loop = pytest.mark.skipif(
    not hasattr(torch, "while_loop"), reason="this torch has no torch.while_loop"
)


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


def _stats() -> dict[str, int]:
    return dict(kiln.counters.snapshot().get("stats", {}))


def _check(
    fn: Callable[..., Any],
    make: Callable[[int], tuple[torch.Tensor, ...]],
    backend: str,
    params: list[torch.Tensor] | None = None,
    calls: int = 6,
) -> None:
    """``fn`` compiled against eager over ``calls`` fresh inputs (``make(i)``): outputs and,
    where something requires grad, the gradients of the inputs and ``params``."""
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for i in range(calls):
        inputs = make(i)
        ours = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        with warnings.catch_warnings():  # eager's torch.cond runs torch's compiler, which warns
            warnings.simplefilter("ignore")
            expected = fn(*inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = compiled(*ours)
        torch.testing.assert_close(got, expected)
        leaves = [t for t in [*inputs, *(params or [])] if t.requires_grad]
        if not leaves:
            continue
        outs = list(expected) if isinstance(expected, tuple) else [expected]
        tangents = [torch.randn_like(o) for o in outs]
        want = torch.autograd.grad(outs, leaves, tangents, allow_unused=True)
        mine = [t for t in [*ours, *(params or [])] if t.requires_grad]
        got_outs = got if isinstance(got, tuple) else (got,)
        have = torch.autograd.grad(got_outs, mine, tangents, allow_unused=True)
        for a, b in zip(have, want, strict=True):
            a = torch.zeros_like(b) if a is None and b is not None else a
            b = torch.zeros_like(a) if b is None and a is not None else b
            torch.testing.assert_close(a, b)
    stats = _stats()
    assert stats.get("graphs_compiled") == 1, stats
    assert stats.get("eager_fallbacks", 0) == 0, stats


def _flipping(i: int, *shape: int, grad: bool = False) -> torch.Tensor:
    """Random values whose sum is positive on even calls, negative on odd ones."""
    x = torch.randn(*shape).abs() + 0.1
    x = x if i % 2 == 0 else -x
    return x.requires_grad_(grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_on_a_tensor_predicate(backend: str) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda a, b: a.sin() + b, lambda a, b: a.cos() * b, (x, y)
        ).exp()

    _check(fn, lambda i: (_flipping(i, 3, 4), torch.randn(3, 4)), backend)
    if backend == "kiln":  # the branches are compiled; the wrapper calls the node
        counts = kiln.counters.snapshot()
        assert counts["extern_kernels"].get("kiln.cond") == 1, counts
        assert "kiln.cond" not in counts.get("fallback_ops", {}), counts
        assert sum(counts["kernels"].values()) >= 3, counts  # each branch, and the graph


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_gradients_follow_the_branch_taken(backend: str) -> None:
    """Each branch differentiates differently; the backward picks the forward's branch."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def true_fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a * b).tanh() @ b.t()

        def false_fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a.exp() @ a.t() - b.sum()

        return torch.cond(x.mean() > 0, true_fn, false_fn, (x, y)) * 2

    _check(
        fn,
        lambda i: (_flipping(i, 4, 3, grad=True), torch.randn(4, 3, requires_grad=True)),
        backend,
    )


class _Gated(nn.Module):
    """Parameters read inside the branches, a closure over an outer tensor, a nested cond."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(6, 6)
        self.down = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().mean(0)

        def inner(h: torch.Tensor) -> torch.Tensor:
            return torch.cond(
                h.amax() > 1.0, lambda t: self.up(t).relu() * scale, lambda t: t / 2, (h,)
            )

        out = torch.cond(x.sum() > 0, inner, lambda t: self.down(t).tanh(), (x,))
        return out + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_with_parameters_closures_and_nesting(backend: str) -> None:
    torch.manual_seed(0)
    model = _Gated()

    def make(i: int) -> tuple[torch.Tensor, ...]:
        x = _flipping(i // 2, 5, 6) * (3 if i % 4 == 0 else 0.05)  # the inner one flips too
        return (x.requires_grad_(),)

    _check(model, make, backend, params=list(model.parameters()), calls=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_returning_a_tuple(backend: str) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = torch.cond(
            x.sum() > 0, lambda t: (t.clone(), t * 3), lambda t: (t.neg(), t + 1), [x]
        )
        return a, b

    _check(fn, lambda i: (_flipping(i, 5, grad=True),), backend)


def test_cond_is_one_node_holding_both_branches() -> None:
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    kiln.compile(fn, backend=backend, fullgraph=True)(torch.randn(3))
    (gm,) = graphs
    (node,) = [n for n in gm.graph.nodes if isinstance(n.target, CondCall)]
    branches = node.target.kiln_cond
    targets = [[n.target for n in b.graph.nodes if n.op.startswith("call")] for b in branches]
    assert targets == [["sin"], ["cos"]]


def test_a_constant_predicate_picks_its_branch_while_tracing() -> None:
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm

    def fn(x: torch.Tensor, flag: bool) -> torch.Tensor:
        return torch.cond(flag, lambda t: t.sin(), lambda t: t.cos(), (x,))

    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, True), x.sin())
    torch.testing.assert_close(compiled(x, False), x.cos())
    assert not any(isinstance(n.target, CondCall) for gm in graphs for n in gm.graph.nodes)


@pytest.mark.parametrize(
    ("false_fn", "why"),
    [
        (lambda t: t.sum(0), "different metadata"),
        (lambda t: t[:], "a view of one"),
        (lambda t: t, "returns an input"),
        (lambda t: t.add_(1) * 3, "in place"),
        (lambda t: t[0].mul_(2) * t, "in place"),
    ],
    ids=["shape", "view", "operand", "mutation", "view_mutation"],
)
def test_branches_torch_refuses_break_the_graph_and_eager_raises(
    false_fn: Callable[[torch.Tensor], torch.Tensor], why: str
) -> None:
    """Branches whose outputs differ in shape, alias an operand or change one in place: a
    graph break, after which torch.cond itself raises torch's error."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * 2, false_fn, (x,))

    with pytest.raises(Unsupported, match=why):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(2, 3))
    with pytest.raises(Exception) as eager:  # torch's own error, from torch.cond itself
        fn(torch.randn(2, 3))
    with pytest.raises(type(eager.value)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.compile(fn, backend="eager")(torch.randn(2, 3))


@needs_while_loop
@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_forward(backend: str) -> None:
    weight = torch.randn(4)

    def fn(n: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.while_loop(
            lambda i, t: (i < n) & (t.abs().sum() < 1e4),
            lambda i, t: (i + 1, t.sin() * weight + t),
            (torch.zeros((), dtype=torch.int64), x),
        )

    _check(fn, lambda i: (torch.tensor(i * 2), torch.randn(4)), backend)


@needs_while_loop
def test_while_loop_is_one_node() -> None:
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.while_loop(lambda t: t.sum() < 100, lambda t: t * 2, (x,))

    out = kiln.compile(fn, backend=backend, fullgraph=True)(torch.ones(3))
    torch.testing.assert_close(out, torch.full((3,), 64.0))  # a tensor, as the body returns
    (gm,) = graphs
    assert sum(isinstance(n.target, WhileLoopCall) for n in gm.graph.nodes) == 1


@needs_while_loop
def test_while_loop_carrying_values_that_require_grad_runs_eagerly_with_a_warning() -> None:
    """No backward for while_loop: the graph's program runs eagerly, one warning, eager's
    values and gradients."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.while_loop(lambda t: t.sum() < 10, lambda t: (t * 2,), (x,))[0]

    compiled = kiln.compile(fn, backend="aot_eager")
    x = torch.ones(3, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="while_loop"):
        out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, torch.full((3,), 4.0))
    torch.testing.assert_close(x.grad, torch.full((3,), 4.0))


def test_a_node_describes_its_branches() -> None:
    """The target's ``__qualname__`` (what a cache of compiled graphs keys a target by)
    differs where the branches differ, nested ones included, and only there."""
    graphs: list[fx.GraphModule] = []

    def backend(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm

    def make(inner: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
        def fn(x: torch.Tensor) -> torch.Tensor:
            def outer(t: torch.Tensor) -> torch.Tensor:
                return torch.cond(t.mean() > 0, inner, lambda u: u * 2, (t,))

            return torch.cond(x.sum() > 0, outer, lambda t: t - 1, (x,))

        return fn

    for inner in (torch.sin, torch.cos, torch.sin):
        kiln.compile(make(inner), backend=backend, fullgraph=True)(torch.randn(3))
    names = [
        n.target.__qualname__
        for g in graphs
        for n in g.graph.nodes
        if n.op == "call_function" and isinstance(n.target, CondCall)
    ]
    assert len(names) == 3 and names[0] == names[2] != names[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_over_closures_alone_and_a_branch_without_gradient(backend: str) -> None:
    """No operands (the branches read closures); one branch's output does not depend on
    what requires grad; an operand that requires none."""
    weight = torch.randn(4, requires_grad=True)

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.cond(x.sum() > 0, lambda: x * weight, lambda: x - weight, ())
        a = a + torch.cond(x.sum() > 0, lambda: torch.ones(4), lambda: x * 2, ())
        b = torch.cond(x.sum() > 0, lambda s, t: torch.zeros_like(s), lambda s, t: s * t, (x, y))
        return a + b

    _check(fn, lambda i: (_flipping(i, 4, grad=True), torch.randn(4)), backend, params=[weight])


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_differentiated_random_branch_runs_eagerly(backend: str) -> None:
    """The backward runs a branch again, which would draw another dropout mask: such a graph
    runs eagerly (one warning), and the gradient follows the forward's mask."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda t: nn.functional.dropout(t, 0.5), lambda t: t.cos(), (x,)
        )

    x = _flipping(0, 200, grad=True)
    with pytest.warns(RuntimeWarning, match="random"):
        out = kiln.compile(fn, backend=backend)(x)
    out.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad != 0, out != 0)
    with torch.no_grad():  # not differentiated: compiled
        torch.testing.assert_close(kiln.compile(fn, backend=backend)(-x), (-x).cos())


def test_a_branch_updating_a_buffer_breaks_the_graph() -> None:
    """BatchNorm in training writes its running statistics, buffers first read inside the
    branch: torch.cond refuses that, so Kiln's trace does."""
    norm = nn.BatchNorm1d(4)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: norm(t), lambda t: t * 2, (x,))

    before = norm.running_mean.clone()
    with pytest.raises(Unsupported, match="in place"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(5, 4) + 1)
    torch.testing.assert_close(norm.running_mean, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_on_strided_operands(backend: str) -> None:
    """Transposed operands: the gradients the backward's cond returns are laid out as the
    node says (compiled code reads them by those strides)."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        xt, yt = x.t(), y[:, ::2]
        out = torch.cond(xt.sum() > 0, lambda a, b: a.exp() * b, lambda a, b: a * b.sin(), (xt, yt))
        return (out + xt.cos() * yt).cumsum(0)  # a kernel adds up each operand's gradients

    _check(
        fn,
        lambda i: (_flipping(i, 5, 3, grad=True), torch.randn(3, 10, requires_grad=True)),
        backend,
    )


@needs_while_loop
@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_on_strided_carried_values(backend: str) -> None:
    """A transposed carried value, through zero or more iterations: every iteration sees the
    layout its compiled functions were compiled for."""

    def fn(n: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        _, out = torch.while_loop(
            lambda i, t: i < n, lambda i, t: (i + 1, t * 2 + t.sum(1, keepdim=True)), (n * 0, x.t())
        )
        return out.cumsum(1)

    _check(fn, lambda i: (torch.tensor(i % 3), torch.randn(4, 3)), backend)


def test_cond_over_convolutions_with_the_kiln_backend() -> None:
    """Branches whose compiled kernels pick their own layouts (convolutions): the graph
    around the node reads the branch's results and gradients as eager's."""
    torch.manual_seed(0)
    wide, narrow = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.cond(x.sum() > 0, lambda t: wide(t).relu(), lambda t: narrow(t).sigmoid(), (x,))
        return (y * 2 + 1).sum(1)

    params = [*wide.parameters(), *narrow.parameters()]
    _check(fn, lambda i: (_flipping(i, 2, 3, 8, 8, grad=True),), "kiln", params=params, calls=4)
