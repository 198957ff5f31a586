"""Autograd-level assumptions of a compiled program, changed between calls: the answer is
always eager's (or, for double backward through a program that cannot run again, an error).

Aliasing: a program that mutates an input is traced for which inputs overlap the mutated one
(the same tensor twice, a view and its base, overlapping views), and each call with another
pattern runs the program compiled for it, in both directions. Double backward: a backward with
``create_graph=True`` is differentiable, so a gradient penalty contributes what it does
eagerly. Grad mode: the program's own ``enable_grad``/``no_grad`` regions decide which outputs
require grad, whatever mode the caller is in.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln

BACKENDS = ["kiln", "aot_eager"]


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _programs() -> dict[str, int]:
    return kiln.counters.snapshot().get("autograd_aot", {})


# ---- inputs that share memory with a mutated input ------------------------------------------


def add_then_sum(a, b):
    a.add_(1)
    return a + b


def _pair(kind, n=8):
    """Two inputs of shape (n,) of ``kind``, over fresh memory."""
    if kind == "distinct":
        return torch.randn(n), torch.randn(n)
    if kind == "same":
        z = torch.randn(n)
        return z, z
    if kind == "overlapping":
        base = torch.randn(n + 2)
        return base[:n], base[2:]
    if kind == "view_and_base":
        base = torch.randn(n)
        return base.view(n), base
    if kind == "base_and_view":
        base = torch.randn(n)
        return base, base[:]
    if kind == "disjoint":
        base = torch.randn(2 * n)
        return base[:n], base[n:]
    raise AssertionError(kind)


def _twins(kind):
    """The same inputs twice over separate memory (eager's and the compiled call's)."""
    state = torch.random.get_rng_state()
    first = _pair(kind)
    torch.random.set_rng_state(state)
    return first, _pair(kind)


KINDS = ["distinct", "same", "overlapping", "view_and_base", "base_and_view", "disjoint"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("first", ["distinct", "same", "overlapping"])
def test_aliased_inputs_with_a_mutation(backend, first):
    cf = kiln.compile(add_then_sum, backend=backend)
    for kind in [first, *KINDS, *reversed(KINDS)]:
        (ea, eb), (ga, gb) = _twins(kind)
        expect = add_then_sum(ea, eb)
        got = cf(ga, gb)
        torch.testing.assert_close(got, expect, msg=kind)
        torch.testing.assert_close((ga, gb), (ea, eb), msg=kind)
    assert kiln.stats().frames_captured == 1
    # distinct and disjoint share a program, as do same/view_and_base/base_and_view
    assert _programs()["programs"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_disjoint_views_of_one_base_use_the_plain_program(backend):
    cf = kiln.compile(add_then_sum, backend=backend)
    for _ in range(3):
        (ea, eb), (ga, gb) = _twins("disjoint")
        torch.testing.assert_close(cf(ga, gb), add_then_sum(ea, eb))
        torch.testing.assert_close((ga, gb), (ea, eb))
    assert _programs() == {"programs": 1}


def scale_then_product(a, b):
    a.mul_(2)
    return (a * b).sum()


def _grad_pair(kind, x):
    if kind == "distinct":
        return x[:8] * 1, x[2:] * 1
    y = x * 1
    if kind == "same":
        return y, y
    if kind == "overlapping":
        return y[:8], y[2:]
    raise AssertionError(kind)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("first", ["distinct", "same", "overlapping"])
def test_aliased_inputs_with_a_mutation_and_gradients(backend, first):
    cf = kiln.compile(scale_then_product, backend=backend)
    for kind in [first, "distinct", "same", "overlapping", "same", "distinct"]:
        n = 8 if kind == "same" else 10
        x = torch.randn(n, requires_grad=True)
        expect = scale_then_product(*_grad_pair(kind, x))
        (expect_grad,) = torch.autograd.grad(expect, x)
        got = cf(*_grad_pair(kind, x))
        (got_grad,) = torch.autograd.grad(got, x)
        torch.testing.assert_close(got, expect, msg=kind)
        torch.testing.assert_close(got_grad, expect_grad, msg=kind)


class Accumulate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x)
        return self.total * x


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_buffer_passed_as_the_argument_it_is_mutated_with(backend):
    model, ref = Accumulate(), Accumulate()
    cm = kiln.compile(model, backend=backend)
    for step in range(5):
        x = torch.randn(4)
        got = cm(model.total if step % 2 else x.clone())
        expect = ref(ref.total if step % 2 else x.clone())
        torch.testing.assert_close(got, expect)
        torch.testing.assert_close(model.total, ref.total)


# ---- double backward ------------------------------------------------------------------------


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return F.softplus(self.body(x)).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_penalty(backend):
    torch.manual_seed(0)
    model = Critic()
    cm = kiln.compile(model, backend=backend)
    for _ in range(3):
        x = torch.randn(5, 6)
        grads = {}
        for name, run in (("eager", model), ("kiln", cm)):
            model.zero_grad()
            xi = x.clone().requires_grad_()
            out = run(xi)
            (g,) = torch.autograd.grad(out, xi, create_graph=True)
            assert g.requires_grad
            (out + g.pow(2).sum()).backward()
            grads[name] = [p.grad.clone() for p in model.parameters()]
        torch.testing.assert_close(grads["kiln"], grads["eager"])


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_with_create_graph_then_a_second_order_gradient(backend):
    def f(x, w):
        return (x.sin() * w).pow(3).sum()

    cf = kiln.compile(f, backend=backend)
    for _ in range(3):
        x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
        cf(x, w).backward(create_graph=True)
        got = (x.grad.clone(), w.grad.clone())
        got_second = torch.autograd.grad(x.grad.sum(), (x, w))
        x.grad = w.grad = None
        f(x, w).backward(create_graph=True)
        torch.testing.assert_close(got, (x.grad, w.grad))
        torch.testing.assert_close(got_second, torch.autograd.grad(x.grad.sum(), (x, w)))


def with_dropout(x):
    return (F.dropout(x, 0.5, training=True) * x).sum()


def mutating(x, buf):
    buf.add_(1)
    return (x * buf).pow(2).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [with_dropout, mutating])
def test_double_backward_that_cannot_be_run_again_raises(backend, fn):
    cf = kiln.compile(fn, backend=backend)
    args = (torch.randn(4),) if fn is with_dropout else (torch.randn(4), torch.zeros(4))
    x = args[0].requires_grad_()
    with pytest.raises(kiln.KilnError, match="create_graph=True"):
        torch.autograd.grad(cf(*args), x, create_graph=True)
    (g,) = torch.autograd.grad(cf(*args), x)  # first order is unaffected
    assert g.shape == x.shape


# ---- grad mode regions inside the program ---------------------------------------------------


def regions(x, w):
    with torch.enable_grad():
        y = x * w
        with torch.no_grad():
            z = y * 2
        u = z * w
    v = u + y
    with torch.set_grad_enabled(True):
        s = v * w
    with torch.no_grad():
        t = s + 1
    return y, z, u, v, s, t


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "caller",
    [torch.no_grad, torch.enable_grad, torch.inference_mode, lambda: torch.set_grad_enabled(False)],
    ids=["no_grad", "enable_grad", "inference_mode", "set_grad_enabled"],
)
def test_grad_mode_regions_whatever_the_callers_mode(backend, caller):
    cf = kiln.compile(regions, backend=backend)
    for _ in range(3):
        x, w = torch.randn(3), torch.randn(3, requires_grad=True)
        with caller():
            expect = regions(x, w)
            got = cf(x, w)
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expect]
        torch.testing.assert_close(got, expect)
        wanted = [(g, e) for g, e in zip(got, expect, strict=True) if e.requires_grad]
        if wanted:
            (gw,) = torch.autograd.grad(sum(g.sum() for g, _ in wanted), w)
            (ew,) = torch.autograd.grad(sum(e.sum() for _, e in wanted), w)
            torch.testing.assert_close(gw, ew)


@pytest.mark.parametrize("backend", BACKENDS)
def test_enable_grad_under_no_grad_trains_a_module(backend):
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            with torch.enable_grad():
                return self.lin(x).pow(2).mean()

    torch.manual_seed(0)
    model = Head()
    cm = kiln.compile(model, backend=backend)
    for _ in range(3):
        x = torch.randn(3, 4)
        with torch.no_grad():
            got = cm(x)
            expect = model(x)
        assert got.requires_grad and expect.requires_grad
        got_grads = torch.autograd.grad(got, list(model.parameters()))
        expect_grads = torch.autograd.grad(expect, list(model.parameters()))
        torch.testing.assert_close(got_grads, expect_grads)


@torch.no_grad()
def _tripled(x):
    return x * 3


@torch.enable_grad()
def _scaled(x, w):
    return x * w


def decorated(x, w):
    a = _tripled(x * w)
    with torch.inference_mode():
        b = x * 2
    return a, b * 1, _scaled(x, w), x * w


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("caller", [torch.no_grad, torch.enable_grad])
def test_grad_mode_decorators_and_inference_mode_inside(backend, caller):
    cf = kiln.compile(decorated, backend=backend)
    for _ in range(2):
        x, w = torch.randn(3), torch.randn(3, requires_grad=True)
        with caller():
            expect, got = decorated(x, w), cf(x, w)
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expect]
        torch.testing.assert_close(got, expect)


def _same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def replayed_views(x):
    # views that change the dtype or set a lazy conj/neg bit are replayed on the input, not
    # rebuilt with as_strided; views of an output are replayed on the output
    y = x * 2
    with torch.no_grad():
        a, b = x.conj(), torch.view_as_real(x)[1:]
        c, d = x.conj().imag, y.view(-1)
    with torch.enable_grad():
        e, f = x.real, y.conj()
    return y, a, b, c, d, e, f, x.imag


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("caller", [torch.no_grad, torch.enable_grad])
@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non_leaf"])
def test_replayed_view_outputs_follow_the_grad_mode_they_were_made_in(backend, caller, leaf):
    cf = kiln.compile(replayed_views, backend=backend)
    for _ in range(3):
        base = torch.randn(4, 3, dtype=torch.cfloat, requires_grad=True)
        x = base if leaf else base * 1
        with caller():
            expect, got = replayed_views(x), cf(x)
        for g, e in zip(got, expect, strict=True):
            assert (g.requires_grad, g.grad_fn is None) == (e.requires_grad, e.grad_fn is None)
            assert (g.is_conj(), g.is_neg()) == (e.is_conj(), e.is_neg())
            assert _same_storage(g, x) == _same_storage(e, x)
        torch.testing.assert_close(got, expect)
        wanted = [(g, e) for g, e in zip(got, expect, strict=True) if e.grad_fn is not None]
        if wanted:
            gsum = sum(g.abs().sum() for g, _ in wanted)
            (gb,) = torch.autograd.grad(gsum, base, retain_graph=True)
            (eb,) = torch.autograd.grad(sum(e.abs().sum() for _, e in wanted), base)
            torch.testing.assert_close(gb, eb)


# ---- outputs changed in place after the call ------------------------------------------------


def keepdim_reductions(x, y):
    return y.sum(1, keepdim=True), 2 - y.amax(1, keepdim=True), x.mean(0, keepdim=True)


def views_of_one_intermediate(x, y):
    t = x * 2 + y
    return t.flatten(), t[0], t.sum()


def a_view_of_an_intermediate(x, y):
    return (x * 2).t()


def a_reduction_and_its_view(x, y):
    a = x.sum(1, keepdim=True)
    return a, a.view(-1), y * 3


def views_of_inputs(x, y):
    return y.t(), x[0], x + y


def _outputs_inputs(layout, grad, seed):
    """Leaves, and x and y (4, 3) made from them: not leaves, so in-place ops on them and on
    their views are allowed, as in most programs."""
    gen = torch.Generator().manual_seed(seed)
    leaves = tuple(torch.randn(5, 5, generator=gen).requires_grad_(grad) for _ in range(2))
    x, y = (t * 1 for t in leaves)
    if layout == "transposed":
        return leaves, (x[:3, :4].t(), y[1:4, :4].t())
    if layout == "sliced":
        return leaves, (x[1:, 1:4], y[:4, 2:])
    return leaves, (x[:4, :3].contiguous(), y[1:, 2:].contiguous())


def _change_output_then_differentiate(fn, layout, grad, caller, k, seed):
    """Call ``fn``, multiply output ``k`` by 0.5 in place, then return every output and input
    (which show the change where they alias it), which require grad, and the gradients."""
    leaves, (x, y) = _outputs_inputs(layout, grad, seed)
    with caller():
        outs = fn(x, y)
    outs = outs if isinstance(outs, tuple) else (outs,)
    outs[k].mul_(0.5)
    values = [t.detach().clone() for t in (*outs, x, y)]
    wanted = [(t * (i + 1)).sum() for i, t in enumerate(outs) if t.requires_grad]
    grads = []
    if wanted:
        found = torch.autograd.grad(sum(wanted), leaves, allow_unused=True)
        grads = [torch.zeros(5, 5) if g is None else g for g in found]
    return values, [t.requires_grad for t in outs], grads


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        keepdim_reductions,
        views_of_one_intermediate,
        a_view_of_an_intermediate,
        a_reduction_and_its_view,
        views_of_inputs,
    ],
)
@pytest.mark.parametrize(
    ("grad", "caller"),
    [(True, torch.enable_grad), (False, torch.enable_grad), (True, torch.no_grad)],
    ids=["grad", "no_grad_inputs", "under_no_grad"],
)
def test_outputs_changed_in_place_after_the_call(backend, fn, grad, caller):
    """Outputs are fresh tensors, views of each other or views of inputs exactly where eager's
    are: an in-place change shows where it does eagerly, and autograd allows it (a view
    returned by an autograd.Function may not be changed in place)."""
    leaves, (x, y) = _outputs_inputs("contiguous", False, 0)
    n = len(fn(x, y)) if isinstance(fn(x, y), tuple) else 1
    for k in range(n):
        kiln.reset()
        cf = kiln.compile(fn, backend=backend)
        for seed, layout in enumerate(["contiguous", "transposed", "sliced", "contiguous"]):
            expect = _or_error(_change_output_then_differentiate, fn, layout, grad, caller, k, seed)
            got = _or_error(_change_output_then_differentiate, cf, layout, grad, caller, k, seed)
            if isinstance(expect, str) or isinstance(got, str):
                assert got == expect
            else:
                torch.testing.assert_close(got, expect)


def _or_error(fn, *args):
    """``fn(*args)``, or the type of the error it raised (eager refuses some in-place changes:
    on a view made under no_grad, on a tensor its backward saved)."""
    try:
        return fn(*args)
    except RuntimeError as e:
        return type(e).__name__


class _Unreachable(torch.autograd.Function):
    """History that eager's backward never reaches: reaching it raises (as eager's own nodes
    do when a tensor they saved was changed in place since)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise AssertionError("a backward reached history that eager's does not")


def masked_by_another_input(a, b):
    return torch.where(a > 0, b, 0.0) * 2, a.argmax()


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_never_reaches_an_input_no_output_differentiates(backend):
    """An input used only where gradients stop (a mask, an argmax) gets no gradient and no
    autograd edge, as eagerly: its history is never walked."""
    cf = kiln.compile(masked_by_another_input, backend=backend)
    for n in (4, 4, 6):
        a_leaf, b = torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True)
        a = _Unreachable.apply(a_leaf)
        for f in (masked_by_another_input, cf):
            out, index = f(a, b)
            assert not index.requires_grad
            ga, gb = torch.autograd.grad((out * 3).sum(), (a_leaf, b), allow_unused=True)
            assert ga is None
            torch.testing.assert_close(gb, torch.where(a > 0, 6.0, 0.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_through_views_of_one_intermediate(backend):
    """Outputs rebuilt as views of a tensor the program made and did not return: the
    differentiable backward finds that tensor in the program run again."""

    def f(x, w):
        t = (x * w).sin()
        return t.flatten(), t[0]

    cf = kiln.compile(f, backend=backend)
    for n in (3, 3, 4):
        x, w = torch.randn(n, 2, requires_grad=True), torch.randn(n, 2, requires_grad=True)
        grads = []
        for run in (f, cf):
            a, b = run(x, w)
            (g,) = torch.autograd.grad((a.pow(2).sum() + b.sum()), x, create_graph=True)
            grads.append(torch.autograd.grad(g.pow(2).sum(), (x, w)))
        torch.testing.assert_close(grads[1], grads[0])


def exp_then_double(x, w):
    return x.exp(), x * 2, (x * w).sum()


def _changed_after_the_call(fn, which, n):
    """Call ``fn``, change in place the output or input ``which`` names, then differentiate:
    the gradients, or the type of the error autograd raised."""
    x, w = (torch.randn(n, 3, requires_grad=True) for _ in range(2))
    xi = x * 1  # not a leaf: it may be changed in place
    outs = fn(xi, w)
    target = {"saved_output": outs[0], "unsaved_output": outs[1], "saved_input": xi}[which]
    target.mul_(0.5)
    return _or_error(lambda: torch.autograd.grad(sum(o.sum() for o in outs), (x, w)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["saved_output", "unsaved_output", "saved_input"])
def test_a_tensor_eagers_backward_saved_changed_after_the_call(backend, which):
    """Eager's backward raises when a tensor it saved (exp's result, mul's inputs) was
    changed in place since; the compiled node saves other values (or recomputes them), and
    raises all the same, where eager does only."""
    cf = kiln.compile(exp_then_double, backend=backend)
    for n in (2, 2, 5):
        torch.manual_seed(n)
        expect = _changed_after_the_call(exp_then_double, which, n)
        torch.manual_seed(n)
        got = _changed_after_the_call(cf, which, n)
        assert isinstance(expect, str) == (which != "unsaved_output")
        if isinstance(expect, str) or isinstance(got, str):
            assert got == expect
        else:
            torch.testing.assert_close(got, expect)


def _write_input_view(x, y):
    x.add_(x)
    return y[..., -1] * 2


def _write_input_view_in_no_grad(x, y):
    with torch.no_grad():
        x.mul_(2)
    return x * y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_write_input_view, _write_input_view_in_no_grad])
@pytest.mark.parametrize("caller", ["no_grad", "enable_grad"])
def test_writes_to_a_view_input_made_with_history_under_no_grad(backend, fn, caller):
    # The input's history is from before the program; a write under no_grad is not part of
    # it (eager allows it even on a view of a leaf), so it is written back without history.
    cf = kiln.compile(fn, backend=backend)
    for _ in range(3):
        results = []
        for run in (fn, cf):
            base = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
            base.requires_grad_(True)
            x, y = base[1:, 1:-1] * 1, torch.randn(4, 3, generator=torch.Generator())
            x = base[1:, 1:-1] if fn is _write_input_view else x
            with torch.no_grad() if caller == "no_grad" else torch.enable_grad():
                if fn is _write_input_view and caller == "enable_grad":
                    with pytest.raises(RuntimeError, match="view of a leaf"):
                        run(x, y)
                    results.append(None)
                    continue
                out = run(x, y)
            results.append((out.detach(), x.detach(), out.requires_grad, x._version))
        if results[0] is not None:
            (oe, xe, re_, ve), (ok, xk, rk, vk) = results
            torch.testing.assert_close(ok, oe)
            torch.testing.assert_close(xk, xe)
            assert (rk, vk > 0) == (re_, ve > 0)
