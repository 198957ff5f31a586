"""Custom torch.autograd.Function calls in one compiled graph, against eager.

Each program calls ``Fn.apply`` under ``fullgraph=True`` and is run several times on fresh
inputs with each backend; outputs and the gradients of inputs and parameters must be eager's.
The Functions have backwards that are not the derivative of their forward (clipped,
straight-through), so a graph that differentiated the forward's ops would give other gradients.
With ``aot_eager`` and ``kiln`` the user's backward is traced into the joint graph: under
``kiln`` it runs as generated kernels, with no ATen op of the user's backward dispatched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils._python_dispatch import TorchDispatchMode

import kiln

BACKENDS = ["eager", "aot_eager", "kiln"]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


class ClippedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bound: float) -> torch.Tensor:
        ctx.bound = bound
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g.clamp(-ctx.bound, ctx.bound), None


class StraightThrough(torch.autograd.Function):
    """Rounds in forward, passes the gradient through unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class SavedProduct(torch.autograd.Function):
    """Two inputs, three outputs (one non-differentiable), gradients only where needed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
        ctx.save_for_backward(x, y)
        mask = x > 0
        ctx.mark_non_differentiable(mask)
        return x * y, x + y, mask

    @staticmethod
    def backward(ctx: Any, g_prod: torch.Tensor, g_sum: torch.Tensor, g_mask: Any) -> Any:
        x, y = ctx.saved_tensors
        gx = (g_prod * y + g_sum).clamp(-0.5, 0.5) if ctx.needs_input_grad[0] else None
        gy = g_prod * x * 2 + g_sum if ctx.needs_input_grad[1] else None
        return gx, gy


class DoubleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 3


class SparseGrads(torch.autograd.Function):
    """Grads of unused outputs stay None (not materialized as zeros)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        return x.sin(), x.cos()

    @staticmethod
    def backward(ctx: Any, ga: Any, gb: Any) -> Any:
        out = None
        if ga is not None:
            out = ga * 0.5
        if gb is not None:
            out = gb if out is None else out + gb
        return out


class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return g * x.sigmoid()


class SetupContextStyle(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x.tanh() * scale

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, scale = inputs
        ctx.save_for_backward(x)
        ctx.scale = scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return g * ctx.scale * torch.sign(x), None


class Quantized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return StraightThrough.apply(self.linear(x)).relu()


def clipped(x: torch.Tensor) -> torch.Tensor:
    return ClippedGrad.apply(x.sin() * 3, 0.5).cos()


def straight_through(x: torch.Tensor) -> torch.Tensor:
    return StraightThrough.apply(x * 2) + x


def saved_product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    prod, total, mask = SavedProduct.apply(x, y)
    return torch.where(mask, prod, total) * 2


def in_place(x: torch.Tensor) -> torch.Tensor:
    h = x + 1
    out = DoubleInPlace.apply(h)
    return out * h


def sparse_grads(x: torch.Tensor) -> torch.Tensor:
    a, _ = SparseGrads.apply(x)
    return a * 2


def once(x: torch.Tensor) -> torch.Tensor:
    return OnceDifferentiable.apply(x * 0.5)


def setup_context_style(x: torch.Tensor) -> torch.Tensor:
    return SetupContextStyle.apply(x, 1.5) + 1


def under_no_grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        frozen = ClippedGrad.apply(x, 0.1)
    return frozen * x, StraightThrough.apply(x)


# name: (function, shapes of the inputs, which of them require grad)
PROGRAMS: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], list[bool]]] = {
    "clipped": (clipped, [(4, 5)], [True]),
    "straight_through": (straight_through, [(7,)], [True]),
    "saved_product": (saved_product, [(3, 4), (3, 4)], [True, True]),
    "saved_product_one_input": (saved_product, [(3, 4), (3, 4)], [False, True]),
    "in_place": (in_place, [(6,)], [True]),
    "sparse_grads": (sparse_grads, [(5,)], [True]),
    "once_differentiable": (once, [(2, 3)], [True]),
    "setup_context": (setup_context_style, [(8,)], [True]),
    "under_no_grad": (under_no_grad, [(4,)], [True]),
    "no_input_requires_grad": (clipped, [(4, 5)], [False]),
}


def _inputs(shapes: list[tuple[int, ...]], grads: list[bool]) -> list[torch.Tensor]:
    return [torch.randn(s).requires_grad_(g) for s, g in zip(shapes, grads, strict=True)]


def _run(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    """Outputs (detached) and the inputs' gradients after a backward through every output."""
    args = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    diff = [o for o in outs if o.requires_grad]
    if diff:
        seeds = [torch.linspace(-2, 2, o.numel()).reshape(o.shape) for o in diff]
        torch.autograd.backward(diff, seeds)
    return [o.detach() for o in outs], [a.grad for a in args]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_matches_eager(backend: str, name: str) -> None:
    fn, shapes, grads = PROGRAMS[name]
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(3):
        inputs = _inputs(shapes, grads)
        out, in_grads = _run(compiled, inputs)
        ref_out, ref_grads = _run(fn, inputs)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(in_grads, ref_grads)
    assert kiln.counters.snapshot().get("stats", {}).get("eager_fallbacks", 0) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_forward_calls_apply(backend: str) -> None:
    torch.manual_seed(0)
    model = Quantized()
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    for _ in range(3):
        x = torch.randn(3, 6)
        compiled(x).pow(2).sum().backward()
        got = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        model(x).pow(2).sum().backward()
        want = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        torch.testing.assert_close(got, want)


def test_backward_is_not_the_true_derivative() -> None:
    inputs = _inputs([(4, 5)], [True])
    _, grads = _run(kiln.compile(clipped, fullgraph=True), inputs)
    _, true_grads = _run(lambda x: (x.sin() * 3).cos(), inputs)
    assert not torch.allclose(grads[0], true_grads[0])


class _SeenOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("backend", "dispatched"), [("eager", True), ("kiln", False)])
def test_kiln_runs_the_users_backward_as_kernels(backend: str, dispatched: bool) -> None:
    """The user's backward clamps; under kiln the clamp is inside a generated kernel."""
    compiled = kiln.compile(clipped, backend=backend, fullgraph=True)
    compiled(torch.randn(4, 5, requires_grad=True))  # compile outside the probe
    x = torch.randn(4, 5, requires_grad=True)
    out = compiled(x)
    with _SeenOps() as seen:
        out.sum().backward()
    assert ("clamp" in seen.ops) is dispatched


GRAD_SCALE = 1.0


class GlobalScaledGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * GRAD_SCALE


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_the_backward_reads_is_guarded(backend: str) -> None:
    global GRAD_SCALE

    def fn(x: torch.Tensor) -> torch.Tensor:
        return GlobalScaledGrad.apply(x) * 2

    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    try:
        for scale in (1.0, 3.0, 1.0, -2.0):
            GRAD_SCALE = scale
            inputs = _inputs([(5,)], [True])
            torch.testing.assert_close(_run(compiled, inputs), _run(fn, inputs))
    finally:
        GRAD_SCALE = 1.0


def test_bloom_training_is_one_graph() -> None:
    """transformers' Bloom calls its GeLU autograd.Function in every MLP."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(config).train()
    assert kiln.explain(model)(input_ids=torch.randint(0, 64, (2, 6))).graph_break_count == 0
    compiled = kiln.compile(model, fullgraph=True)
    for _ in range(2):
        ids = torch.randint(0, 64, (2, 6))
        results = []
        for run in (compiled, model):
            out = run(input_ids=ids, labels=ids)
            out.loss.backward()
            results.append((out.loss.detach(), [p.grad.clone() for p in model.parameters()]))
            model.zero_grad()
        torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_needs_input_grad_follows_each_call(backend: str) -> None:
    compiled = kiln.compile(saved_product, backend=backend, fullgraph=True)
    for grads in ([True, True], [False, True], [True, False], [True, True]):
        inputs = _inputs([(3, 4), (3, 4)], grads)
        torch.testing.assert_close(_run(compiled, inputs), _run(saved_product, inputs))


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_through_the_users_backward(backend: str) -> None:
    compiled = kiln.compile(setup_context_style, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(5, requires_grad=True)
        penalties = []
        for fn in (compiled, setup_context_style):
            (g,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
            penalties.append(torch.autograd.grad((g * x).pow(2).sum(), x)[0])
        torch.testing.assert_close(penalties[0], penalties[1])


def _python_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``Function.apply`` as torch 2.11 defines it: a Python classmethod over the C one."""
    return torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)(*args, **kwargs)


_python_apply.__name__ = "apply"


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_defined_in_python_is_still_one_node(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some torch versions define ``Function.apply`` in Python: reading it on a subclass must
    still reach the Function support, not trace torch's own ``apply`` as user code."""
    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(_python_apply))

    def f(x: torch.Tensor) -> torch.Tensor:
        return StraightThrough.apply(x * 2) + ClippedGrad.apply(x, 0.5)

    cf = kiln.compile(f, backend=backend, fullgraph=True)
    for _ in range(3):
        x = torch.randn(5, requires_grad=True)
        x2 = x.detach().requires_grad_()
        want, got = f(x), cf(x2)
        torch.testing.assert_close(got, want)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)


def test_functions_read_through_two_classes_are_one_function() -> None:
    """``A.f is Base.f`` (torch's ``setup_context`` test reads it so): the same function read
    through a subclass and its base is one object, in the trace as in Python."""

    class Base:
        @staticmethod
        def s(x: torch.Tensor) -> torch.Tensor:
            return x

        def m(self, x: torch.Tensor) -> torch.Tensor:
            return x

    class Sub(Base):
        pass

    def f(x: torch.Tensor) -> torch.Tensor:
        same = (Sub.s is Base.s, Sub.s == Base.s, Sub.s != Base.s, Sub.m is Base.m)
        return x + sum(k * int(v) for k, v in zip((1, 10, 100, 1000), same, strict=True))

    cf = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.zeros(2)
    torch.testing.assert_close(cf(x), f(x))
