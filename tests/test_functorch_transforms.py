"""torch.func transforms inside compiled code, in one graph, against eager.

``vmap`` (``torch.vmap`` too), ``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``,
``jacfwd``, ``hessian`` and ``functional_call`` of user functions are traced under
``fullgraph=True``: the function becomes a subgraph of one node that applies the transform,
which the eager backend runs as it is and autograd_aot turns into batched or differentiated
ATen ops. Each program runs several times on fresh inputs with each backend and must give
eager's values; in training, the gradients that flow through a vmapped function too. What
cannot be traced (random ops under ``randomness="error"``, a side effect in the function)
breaks cleanly, naming the transform.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import (
    functional_call,
    grad,
    grad_and_value,
    hessian,
    jacfwd,
    jacrev,
    jvp,
    vjp,
    vmap,
)

import kiln
from kiln.capture.errors import Unsupported

BACKENDS = ["eager", "aot_eager", "kiln"]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


def _no_fallback() -> None:
    assert kiln.counters.snapshot().get("stats", {}).get("eager_fallbacks", 0) == 0


torch.manual_seed(0)
MLP = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
W = torch.randn(3)


def _batched_dot(x: torch.Tensor) -> torch.Tensor:
    return vmap(lambda row: (row * W).sum().sin())(x)


def _in_out_dims(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return vmap(lambda a, b: a.unsqueeze(-1) * b, in_dims=(1, None), out_dims=1)(x, y)


def _nested(x: torch.Tensor) -> torch.Tensor:
    return vmap(vmap(lambda a: a.exp().sum() * a))(x)


def _alias(x: torch.Tensor) -> torch.Tensor:
    return torch.vmap(lambda a: a.cumsum(0))(x)


def _pytree_vmap(x: torch.Tensor, y: torch.Tensor) -> Any:
    out = vmap(lambda d: {"s": d["a"] + d["b"], "p": [d["a"] * 2, d["b"].sum()]})({"a": x, "b": y})
    return out["s"], out["p"][0] * out["p"][1].unsqueeze(-1)


def _grad(x: torch.Tensor) -> torch.Tensor:
    return grad(lambda a: (a.sin() * W).sum())(x)


def _grad_and_value_aux(x: torch.Tensor) -> Any:
    return grad_and_value(lambda a: ((a**2).sum(), a.mean()), has_aux=True)(x)


def _grad_argnums(x: torch.Tensor, y: torch.Tensor) -> Any:
    return grad(lambda a, b: (a * b.cos()).sum(), argnums=(0, 1))(x, y)


def _vmap_of_grad(x: torch.Tensor) -> torch.Tensor:
    return vmap(grad(lambda a: (a.sin() * W).sum()))(x)


def _vjp(x: torch.Tensor, ct: torch.Tensor) -> Any:
    out, pullback = vjp(lambda a: a.exp() * W, x)
    return out, pullback(ct)


def _jvp(x: torch.Tensor, t: torch.Tensor) -> Any:
    return jvp(lambda a: a.sin() * a, (x,), (t,))


def _jacobians(x: torch.Tensor) -> Any:
    def f(a: torch.Tensor) -> torch.Tensor:
        return a.sin() * a.sum()

    return jacrev(f)(x), jacfwd(f)(x), hessian(lambda a: (a**3).sum())(x)


def _functional_call(x: torch.Tensor, w0: torch.Tensor) -> torch.Tensor:
    params = dict(MLP.named_parameters())
    params["0.weight"] = w0
    return functional_call(MLP, params, (x,))


def _ensemble(x: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    def one(w: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        return functional_call(MLP, {"0.weight": w}, (xs,))

    return vmap(one, in_dims=(0, None))(ws, x)


def _per_sample_grads(x: torch.Tensor, y: torch.Tensor) -> Any:
    params = {k: v.detach() for k, v in MLP.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return ((functional_call(MLP, p, (xi.unsqueeze(0),)) - yi) ** 2).sum()

    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)


def _vmap_of_module(x: torch.Tensor) -> torch.Tensor:
    return vmap(MLP)(x) + vmap(lambda r: MLP(r).relu())(x)


def _nested_masks(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """transformers' mask building: four vmaps over index vectors, a device move inside."""

    def mask(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return qi.new_ones((), dtype=torch.bool) & (ki <= qi).to(qi.device) & (b >= h)

    for dims in [(None, None, None, 0), (None, None, 0, None), (None, 0, None, None)]:
        mask = vmap(mask, in_dims=dims, out_dims=0)
    return vmap(mask, in_dims=(0, None, None, None))(torch.arange(2), torch.arange(1), q, kv)


class _Take(torch.autograd.Function):
    """transformers' padding masks index through such a Function (torch's ``mod_index``),
    kept in a variable as ``ModIndex.apply``, under vmap."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index(x, [i])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[1])
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        (i,) = ctx.saved_tensors
        grad = grad_out.new_zeros(ctx.shape).index_put((i,), grad_out, accumulate=True)
        return grad, None


_take = _Take.apply


def _vmap_of_function_alias(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return vmap(lambda i: _take(x, i) * 2)(idx) + _take(x, idx)


_BATCHED = vmap(lambda r: (r * W).sum().sin())
_HESSIAN = hessian(lambda a: (a**3).sum())


class _PerRow(nn.Module):
    """A transform made once, in ``__init__``, over a bound method."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.rows = vmap(self.row)

    def row(self, r: torch.Tensor) -> torch.Tensor:
        return self.lin(r).relu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(x)


PER_ROW = _PerRow()


def _made_outside(x: torch.Tensor) -> Any:
    return _BATCHED(x), _HESSIAN(x[0]), PER_ROW(x)


CASES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[torch.Tensor, ...]]]] = {
    "vmap": (_batched_dot, lambda n: (torch.randn(n, 3),)),
    "vmap_in_out_dims": (_in_out_dims, lambda n: (torch.randn(4, n), torch.randn(5))),
    "vmap_nested": (_nested, lambda n: (torch.randn(n, 2, 3),)),
    "torch_vmap": (_alias, lambda n: (torch.randn(n, 4),)),
    "vmap_pytree": (_pytree_vmap, lambda n: (torch.randn(n, 2), torch.randn(n, 2))),
    "grad": (_grad, lambda n: (torch.randn(3),)),
    "grad_and_value": (_grad_and_value_aux, lambda n: (torch.randn(n),)),
    "grad_argnums": (_grad_argnums, lambda n: (torch.randn(n), torch.randn(n))),
    "vmap_of_grad": (_vmap_of_grad, lambda n: (torch.randn(n, 3),)),
    "vjp": (_vjp, lambda n: (torch.randn(3), torch.randn(3))),
    "jvp": (_jvp, lambda n: (torch.randn(n), torch.randn(n))),
    "jacobians": (_jacobians, lambda n: (torch.randn(4),)),
    "functional_call": (_functional_call, lambda n: (torch.randn(n, 3), torch.randn(8, 3))),
    "ensemble": (_ensemble, lambda n: (torch.randn(n, 3), torch.randn(4, 8, 3))),
    "per_sample_grads": (_per_sample_grads, lambda n: (torch.randn(n, 3), torch.randn(n, 2))),
    "vmap_of_module": (_vmap_of_module, lambda n: (torch.randn(n, 3),)),
    "nested_masks": (_nested_masks, lambda n: (torch.randperm(n), torch.randperm(n + 1))),
    "made_outside": (_made_outside, lambda n: (torch.randn(n, 3),)),
    "function_alias": (_vmap_of_function_alias, lambda n: (torch.randn(n), torch.randperm(n))),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_transform_matches_eager(case: str, backend: str) -> None:
    fn, make = CASES[case]
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for n in (5, 5, 6):
        args = make(n)
        torch.testing.assert_close(compiled(*args), fn(*args))
    _no_fallback()


def test_one_graph_with_one_node_per_transform() -> None:
    """The transform is a node of the frame's graph (nested ones nodes of its subgraph), not
    a graph break; its subgraph holds the function's ops."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm

    x = torch.randn(4, 3)
    torch.testing.assert_close(kiln.compile(_vmap_of_grad, backend=backend)(x), _vmap_of_grad(x))
    (gm,) = graphs
    (node,) = [
        n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
    ]
    assert node.target.__name__ == "functorch_vmap"
    inner = [n.target for n in node.target.subgraph.graph.nodes if n.op == "call_function"]
    assert [t.__name__ for t in inner if callable(t)][0] == "functorch_grad"


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_gradients_flow_through_vmap(backend: str) -> None:
    """Training: the loss of a vmapped per-example function; the gradients of its input and
    of the module's parameters (read inside the vmapped function) are eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.Linear(8, 1))

    def loss(x: torch.Tensor) -> torch.Tensor:
        return vmap(lambda r: model(r).squeeze(-1) ** 2)(x).mean()

    def step(fn: Callable[..., Any], x: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        x = x.detach().requires_grad_(True)
        out = fn(x)
        out.backward()
        return [out.detach(), x.grad, *(p.grad for p in model.parameters())]

    compiled = kiln.compile(loss, backend=backend, fullgraph=True)
    for n in (6, 6, 7):
        x = torch.randn(n, 3)
        torch.testing.assert_close(step(compiled, x), step(loss, x))
    _no_fallback()


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_gradients_flow_through_grad(backend: str) -> None:
    """A gradient penalty: ``grad`` inside the loss, differentiated again by the backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def loss(x: torch.Tensor) -> torch.Tensor:
        g = vmap(grad(lambda r: model(r).sum()))(x)
        return model(x).mean() + (g**2).sum()

    def step(fn: Callable[..., Any], x: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        out = fn(x)
        out.backward()
        return [out.detach(), *(p.grad for p in model.parameters())]

    compiled = kiln.compile(loss, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(5, 3)
        torch.testing.assert_close(step(compiled, x), step(loss, x))
    _no_fallback()


def _random_inside(x: torch.Tensor) -> torch.Tensor:
    return vmap(lambda r: r + torch.rand_like(r))(x)


def test_random_ops_under_randomness_error_break_cleanly() -> None:
    """Eager refuses random ops under ``randomness="error"``; so does the compiled call (the
    transform runs in Python after a break), and ``fullgraph=True`` names the transform."""
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="randomness"):
        _random_inside(x)
    with pytest.raises(RuntimeError, match="randomness"):
        kiln.compile(_random_inside)(x)
    with pytest.raises(Unsupported, match="vmap"):
        kiln.compile(_random_inside, fullgraph=True)(x)


def test_random_ops_with_randomness_different_run_in_the_graph() -> None:
    x = torch.randn(4, 3)
    fn = kiln.compile(
        lambda x: vmap(lambda r: r + torch.rand_like(r), randomness="different")(x),
        fullgraph=True,
    )
    out = fn(x)
    noise = out - x
    assert bool(((noise >= 0) & (noise < 1)).all()) and not torch.equal(noise[0], noise[1])


def test_side_effect_in_the_function_breaks_and_matches_eager() -> None:
    def fn(x: torch.Tensor, log: list[int]) -> torch.Tensor:
        def f(r: torch.Tensor) -> torch.Tensor:
            log.append(1)
            return r * 2

        return vmap(f)(x).sin()

    x = torch.randn(3, 2)
    with pytest.raises(Unsupported, match="functorch"):
        kiln.compile(fn, fullgraph=True)(x, [])
    eager_log: list[int] = []
    compiled_log: list[int] = []
    torch.testing.assert_close(kiln.compile(fn)(x, compiled_log), fn(x, eager_log))
    assert compiled_log == eager_log


def test_options_that_are_not_constants_break() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return vmap(torch.sin, in_dims=x)(x)  # eager raises: in_dims must be an int or pytree

    x = torch.randn(3, 2)
    with pytest.raises(Unsupported, match="not a constant"):
        kiln.compile(fn, fullgraph=True)(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vector_matmul_in_and_out_of_vmap(backend: str) -> None:
    """``vector @ matrix``: ATen's matmul squeezes its mm in place, which fakes mirror and the
    ATen tracer records as a view (the mm node keeps its own shape); a per-example function
    meets it under vmap. A restride in user code still breaks the graph."""
    m = torch.randn(3, 2)

    def fn(a: torch.Tensor, rows: torch.Tensor) -> Any:
        return a @ m, vmap(lambda r: r @ m)(rows), (rows @ m).sum()

    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for n in (4, 4, 5):
        args = (torch.randn(3), torch.randn(n, 3))
        torch.testing.assert_close(compiled(*args), fn(*args))

    def restrides(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.t_()
        return y + 1

    assert kiln.explain(restrides)(torch.randn(2, 3)).graph_break_count == 1
    x = torch.randn(2, 3)
    torch.testing.assert_close(kiln.compile(restrides, backend=backend)(x), restrides(x))
