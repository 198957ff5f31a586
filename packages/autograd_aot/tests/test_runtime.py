"""The runtime wrapper: grad modes, retain_graph, double backward, RNG, module state."""

import operator
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from kiln.autograd_aot import aot_compile, aot_eager, aot_eager_decomp_partition


def _bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_inference_path_under_no_grad(context):
    model = _bn_model()
    gm, ref = fx.symbolic_trace(model), _bn_model()
    x = torch.randn(5, 4)
    with context():
        compiled = aot_eager_decomp_partition(gm, [x])
        out = compiled(x)
        expect = ref(x)
    assert not compiled.variant(joint=False).program.is_joint
    torch.testing.assert_close(out, expect)
    torch.testing.assert_close(dict(gm.named_buffers()), dict(ref.named_buffers()))
    assert not out.requires_grad


def test_running_statistics_are_written_back_in_one_foreach_copy(monkeypatch):
    model = _bn_model()
    gm, ref = fx.symbolic_trace(model), _bn_model()
    compiled = aot_eager_decomp_partition(gm, [torch.randn(5, 4)])
    calls = []
    copy = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda d, s: calls.append(len(d)) or copy(d, s))
    for _ in range(2):
        x = torch.randn(5, 4)
        compiled(x).sum().backward()
        ref(x).sum().backward()
    # running_mean, running_var and num_batches_tracked, each step in one call
    assert calls == [3, 3]
    torch.testing.assert_close(dict(gm.named_buffers()), dict(ref.named_buffers()))


class _TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _bn_model()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.net(x)
        return y, y.exp()


def test_backward_makes_no_zeros_for_tangents_the_loss_does_not_reach():
    """Outputs the loss ignores (a second result, BatchNorm's new statistics) get no
    materialized zero gradient: the backward run is the one for the outputs that got one."""
    model, ref = _TwoOutputs(), _TwoOutputs()
    x = torch.randn(5, 4, requires_grad=True)
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(model), [x])
    first, _ = compiled(x)
    with torch.profiler.profile() as prof:
        first.sum().backward()
    zeros = [e.name for e in prof.events() if e.name == "aten::zeros"]
    assert zeros == []
    got = x.grad
    x.grad = None
    ref(x)[0].sum().backward()
    torch.testing.assert_close(got, x.grad)


def test_calls_alternating_modes_and_missing_gradients_match_eager():
    """The call path's per-program shortcuts (the program of an unmutating mode looked up
    directly, every gradient present, the saved list handed to the full backward) give
    eager's values, and the other cases still take their own program or backward."""
    model, ref = _TwoOutputs(), _TwoOutputs()
    ref.load_state_dict(model.state_dict())
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(model), [torch.randn(5, 4)])
    for step in range(6):
        x = torch.randn(5, 4)
        if step % 3 == 2:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), ref(x))
            continue
        got, want = compiled(x), ref(x)
        torch.testing.assert_close(got, want)
        loss = (
            (lambda outs: outs[0].sum()) if step % 3 else (lambda outs: sum(o.sum() for o in outs))
        )
        loss(got).backward()
        loss(want).backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        torch.testing.assert_close(dict(model.named_buffers()), dict(ref.named_buffers()))
    assert {p.program.is_joint for p in compiled.variants()} == {True, False}
    assert len(compiled.variants()) == 2


def test_a_saved_input_is_held_as_itself_and_still_version_checked():
    """A linear layer's forward saves its weight (an input): the node holds the weight
    itself (no detached alias per call) and a change of it in place before the backward
    raises, as eager's does; the gradients match eager's otherwise."""
    lin, ref = nn.Linear(3, 2), nn.Linear(3, 2)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(4, 3, requires_grad=True)
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(lin), [x])
    compiled(x).sum().backward()
    grads = (x.grad, lin.weight.grad)
    x.grad = None
    ref(x).sum().backward()
    torch.testing.assert_close(grads, (x.grad, ref.weight.grad))
    program = compiled.variant(joint=True)
    assert any(j >= 0 for j in program.exposed_inputs)
    out, expect = compiled(x), ref(x)
    with torch.no_grad():
        lin.weight.add_(1)
        ref.weight.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        expect.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_switching_grad_mode_compiles_both_variants():
    gm = fx.symbolic_trace(nn.Linear(3, 2))
    x = torch.randn(4, 3)
    compiled = aot_eager(gm, [x])
    with torch.no_grad():
        compiled(x)
    compiled(x).sum().backward()
    assert {p.program.is_joint for p in compiled.variants()} == {True, False}
    assert gm.weight.grad is not None


def test_parameter_updates_are_seen():
    lin = nn.Linear(3, 2)
    gm = fx.symbolic_trace(lin)
    x = torch.randn(4, 3)
    compiled = aot_eager(gm, [x])
    with torch.no_grad():
        gm.weight.mul_(2)
    torch.testing.assert_close(compiled(x), gm(x))


def test_retain_graph_and_second_backward():
    x = torch.randn(5, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(lambda x: (x.sin() * x).sum()), [x])
    y = compiled(x)
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()
    torch.testing.assert_close(x.grad, 2 * first)


class _Boxed:
    """A compiled backward that takes its arguments as a list (as loopir's does), and counts
    how many of them died once it let go of them."""

    def __init__(self, gm: fx.GraphModule, died: list[int]) -> None:
        self.gm, self.died = gm, died

    def __call__(self, *args):
        raise AssertionError("the runtime should hand a boxed backward its arguments as a list")

    def call_boxed(self, args):
        values = list(args)
        args.clear()
        out = self.gm(*values)
        refs = [weakref.ref(v) for v in values if isinstance(v, torch.Tensor)]
        del values
        self.died.append(sum(r() is None for r in refs))
        return out


@pytest.mark.parametrize("retain", [False, True])
def test_backward_frees_saved_activations_unless_the_graph_is_retained(retain):
    """The activations saved for the backward die as soon as the backward drops them, as in
    eager, rather than when autograd's node does; with retain_graph autograd keeps them."""
    died: list[int] = []

    def fn(x, w):
        return ((x @ w).relu() @ w).sum()

    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    compiled = aot_compile(
        fx.symbolic_trace(fn), [x, w], fw_compiler=lambda gm, ex: gm,
        bw_compiler=lambda gm, ex: _Boxed(gm, died),
    )  # fmt: skip
    compiled(x, w).backward(retain_graph=retain)
    torch.testing.assert_close(x.grad, torch.func.grad(fn)(x, w))
    assert (died[0] == 0) if retain else (died[0] >= 1), died


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_double_backward_differentiates_the_program_again(backend):
    def fn(x, w):
        return (x.sin() * w).pow(3).sum()

    x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    compiled = backend(fx.symbolic_trace(fn), [x, w])
    for _ in range(2):
        x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
        got = torch.autograd.grad(compiled(x, w), (x, w), create_graph=True)
        expect = torch.autograd.grad(fn(x, w), (x, w), create_graph=True)
        assert all(g.requires_grad for g in got)
        torch.testing.assert_close(got, expect)
        penalty_got = torch.autograd.grad(got[0].pow(2).sum() + got[1].sum(), (x, w))
        penalty_expect = torch.autograd.grad(expect[0].pow(2).sum() + expect[1].sum(), (x, w))
        torch.testing.assert_close(penalty_got, penalty_expect)


def test_double_backward_through_a_non_leaf_input_and_a_tangent():
    def fn(h):
        return h.tanh() * 3

    x = torch.randn(4, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(fn), [x * 2])
    v = torch.randn(4, requires_grad=True)  # a tangent with history: Hessian-vector style
    (got,) = torch.autograd.grad(compiled(x * 2), x, v, create_graph=True)
    (expect,) = torch.autograd.grad(fn(x * 2), x, v, create_graph=True)
    torch.testing.assert_close(got, expect)
    got_second = torch.autograd.grad(got.sum(), (x, v))
    expect_second = torch.autograd.grad(expect.sum(), (x, v))
    torch.testing.assert_close(got_second, expect_second)


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda x, b: (x * b.add_(1)).sum(), "mutates an input"),
        (lambda x, b: (F.dropout(x, 0.5) * x).sum(), "random numbers"),
    ],
)
def test_double_backward_raises_where_the_program_cannot_run_again(fn, why):
    from kiln.autograd_aot import AotError

    x = torch.randn(5, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(fn), [x, torch.zeros(5)])
    with pytest.raises(AotError, match=why):
        torch.autograd.grad(compiled(x, torch.zeros(5)), x, create_graph=True)
    (g,) = torch.autograd.grad(compiled(x, torch.zeros(5)), x)  # first order still works
    assert not g.requires_grad


def test_double_backward_raises_after_an_input_changed_in_place():
    from kiln.autograd_aot import AotError

    x = torch.randn(5, requires_grad=True)
    h = x * 1
    # eager's backward saves h + 1, not h (it would raise itself, as the node then does)
    compiled = aot_eager(fx.symbolic_trace(lambda h: (h + 1).pow(2).sum()), [h])
    out = compiled(h)
    with torch.no_grad():
        h.add_(1)
    with pytest.raises(AotError, match="modified in place"):
        torch.autograd.grad(out, x, create_graph=True)


def _with_grad_mode(region: bool, after: bool) -> fx.GraphModule:
    """``(x, w) -> (x * w, x + w, (x * w).view(-1))`` with the product in a ``region`` grad-mode
    block, as capture records ``with torch.enable_grad()`` (fx.symbolic_trace cannot)."""
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.call_function(torch._C._set_grad_enabled, (region,))
    y = g.call_function(operator.mul, (x, w))
    g.call_function(torch._C._set_grad_enabled, (after,))
    z = g.call_function(operator.add, (x, w))
    g.output((y, z, g.call_method("view", (y, -1))))
    return fx.GraphModule(nn.Module(), g)


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
@pytest.mark.parametrize("caller", [torch.no_grad, torch.enable_grad])
def test_grad_mode_regions_inside_the_program(backend, caller):
    region = caller is torch.no_grad  # the program flips the caller's mode
    gm = _with_grad_mode(region, not region)
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    with caller():
        compiled = backend(gm, [x, w])
    for _ in range(2):
        x, w = torch.randn(3), torch.randn(3, requires_grad=True)
        with caller():
            got, expect = compiled(x, w), gm(x, w)
            assert torch.is_grad_enabled() is not region  # the program restored the mode
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expect]
        assert [t.requires_grad for t in expect] == [region, not region, region]
        torch.testing.assert_close(got, expect)
        assert [t.grad_fn is None for t in got] == [t.grad_fn is None for t in expect]
        if region:  # the view made after the region has no gradient path, as in eager
            (gw,) = torch.autograd.grad(got[0].sum() + got[2].sum(), w)
            (ew,) = torch.autograd.grad(expect[0].sum() + expect[2].sum(), w)
            torch.testing.assert_close(gw, ew)


def test_no_output_differentiable_under_grad_mode():
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    g.call_function(torch._C._set_grad_enabled, (False,))
    y = g.call_function(operator.mul, (x, w))
    g.call_function(torch._C._set_grad_enabled, (True,))
    g.output((y,))
    w = torch.randn(3, requires_grad=True)
    compiled = aot_eager(fx.GraphModule(nn.Module(), g), [torch.randn(3), w])
    (got,) = compiled(torch.randn(3), w)
    assert not got.requires_grad and not compiled.variants()[0].program.is_joint


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_mutated_input_sharing_memory_with_another(backend):
    def fn(a, b, w):
        a.add_(1)  # b overlaps a: it sees the write
        b[-1:].mul_(w[0])
        return b * 2, a.t()

    base = torch.randn(7)
    w = torch.randn(1, requires_grad=True)
    expect_base, got_base = base.clone(), base.clone()
    compiled = backend(fx.symbolic_trace(fn), [got_base[:4].view(2, 2), got_base[2:6], w])
    assert compiled.variant(joint=True).layout.groups == ((0, 1),)
    expect = fn(expect_base[:4].view(2, 2), expect_base[2:6], w)
    got = compiled(got_base[:4].view(2, 2), got_base[2:6], w)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(got_base, expect_base)
    assert got[1]._base is not None  # an alias of the input, as in eager
    (ge,) = torch.autograd.grad(expect[0].sum(), w)
    (gg,) = torch.autograd.grad(got[0].sum(), w)
    torch.testing.assert_close(gg, ge)


def test_mutated_input_sharing_memory_with_inputs_of_another_dtype_is_rejected():
    from kiln.autograd_aot import AotError

    base = torch.zeros(6)

    def fn(a, b):
        a.add_(1)
        return b * 2

    with pytest.raises(AotError, match="share memory"):
        aot_eager(fx.symbolic_trace(fn), [base, base.view(torch.int32)])


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_dropout_forward_and_backward_use_the_same_bits(backend):
    x = (torch.rand(64, 64) + 0.5).requires_grad_()
    compiled = backend(fx.symbolic_trace(lambda x: F.dropout(x, 0.5, training=True) * 3), [x])
    out = compiled(x)
    out.sum().backward()
    kept = out != 0
    torch.testing.assert_close(out[kept], (x * 6)[kept])
    torch.testing.assert_close(x.grad, kept.float() * 6)
    assert 0.4 < kept.float().mean().item() < 0.6  # eager's distribution
    torch.manual_seed(1)
    a = compiled(x)
    torch.manual_seed(1)
    assert torch.equal(a, compiled(x))  # seeded by torch's generator


@pytest.mark.gpu
def test_training_on_cuda(check):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 4)).cuda()
    x = torch.randn(4, 8, device="cuda", requires_grad=True)
    compiled = check(model, [x], backend=aot_eager_decomp_partition)
    fw = compiled.variant(joint=True).forward
    vals = [n.meta["val"] for n in fw.graph.nodes if n.op == "call_function"]
    assert all(v.device.type == "cuda" for v in vals if isinstance(v, torch.Tensor))


@pytest.mark.gpu
def test_seeded_dropout_on_cuda():
    x = (torch.rand(64, 64, device="cuda") + 0.5).requires_grad_()
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(lambda x: F.dropout(x, 0.5)), [x])
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out != 0).float() * 2)
    assert 0.4 < (out != 0).float().mean().item() < 0.6


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_outputs_viewing_another_output_alias_it(backend):
    def fn(x):
        y = x * 2
        return y, y.view(-1), y.t()[0]

    x = torch.randn(2, 3, requires_grad=True)
    compiled = backend(fx.symbolic_trace(fn), [x])
    y, flat, row = compiled(x)
    assert flat._base is y and row._base is y
    flat.add_(1)  # allowed, as in eager: y sees it
    torch.testing.assert_close(y, x * 2 + 1)
    (row * 3).sum().backward()
    expect = torch.zeros(2, 3)
    expect[:, 0] = 6
    torch.testing.assert_close(x.grad, expect)
    assert compiled.variant(joint=True).program.num_user_outputs == 1


def _add_then_sum(a, b):
    a.add_(1)
    return a + b


def _calls(kind, n=8):
    """A maker of input pairs of ``kind``, over fresh memory on every call."""
    views = {
        "distinct": (2 * n, lambda b: (b[:n], b[n:].clone())),
        "same": (n, lambda b: (b, b)),
        "overlapping": (n + 2, lambda b: (b[:n], b[2 : n + 2])),
        "view_and_base": (n, lambda b: (b.view(n), b)),
        "base_and_view": (n, lambda b: (b, b[:])),
        "interleaved": (2 * n, lambda b: (b[::2], b[1::2])),
        "disjoint": (2 * n, lambda b: (b[:n], b[n:])),
    }
    size, split = views[kind]
    return lambda: split(torch.randn(size))


def _twins(make):
    """The same call twice over separate memory: one for eager, one for the compiled program."""
    state = torch.random.get_rng_state()
    a = make()
    torch.random.set_rng_state(state)
    return a, make()


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
@pytest.mark.parametrize("first", ["distinct", "same", "overlapping"])
def test_aliasing_of_mutated_inputs_selects_the_program(backend, first):
    _, args = _twins(_calls(first))
    compiled = backend(fx.symbolic_trace(_add_then_sum), list(args))
    kinds = ["distinct", "same", "overlapping", "view_and_base", "base_and_view"]
    for kind in [*kinds, "interleaved", "disjoint", *kinds]:
        expect_in, got_in = _twins(_calls(kind))
        expect = _add_then_sum(*expect_in)
        got = compiled(*got_in)
        torch.testing.assert_close(got, expect, msg=kind)
        torch.testing.assert_close(got_in, expect_in, msg=kind)
    # one program per pattern: disjoint views run the distinct one, a view of the whole
    # base the one for the same tensor twice
    assert len(compiled.variants()) == 4


def test_inputs_that_share_memory_without_a_mutation_share_the_program():
    compiled = aot_eager(fx.symbolic_trace(lambda a, b: a * b), [torch.randn(3)] * 2)
    z = torch.randn(3)
    torch.testing.assert_close(compiled(z, z), z * z)
    torch.testing.assert_close(compiled(z, z[:]), z * z)
    assert len(compiled.variants()) == 1


def _scale_then_product(a, b):
    a.mul_(2)
    return (a * b).sum()


def _view_and_base(y):
    return y.view(8), y


def _overlapping(y):
    return y[:8], y[2:]


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
def test_aliased_mutated_inputs_that_require_grad(backend):
    makers = {
        "distinct": lambda x: (x[:8] * 1, x[2:] * 1),
        "same": lambda x: (x[:8] * 1,) * 2,
        "overlapping": lambda x: _overlapping(x * 1),
        "view_and_base": lambda x: _view_and_base(x[:8] * 1),
    }
    x = torch.randn(10, requires_grad=True)
    compiled = backend(fx.symbolic_trace(_scale_then_product), list(makers["distinct"](x)))
    for kind in [*makers, *makers]:
        x = torch.randn(10, requires_grad=True)
        a, b = makers[kind](x)
        expect = _scale_then_product(a, b)
        (expect_grad,) = torch.autograd.grad(expect, x)
        expect_a = a.detach().clone()
        a, b = makers[kind](x)
        got = compiled(a, b)
        (got_grad,) = torch.autograd.grad(got, x)
        torch.testing.assert_close(got, expect, msg=kind)
        torch.testing.assert_close(got_grad, expect_grad, msg=kind)
        torch.testing.assert_close(a, expect_a, msg=kind)
    assert len(compiled.variants()) == 3


def test_aliased_views_of_a_leaf_that_requires_grad_raise_as_in_eager():
    compiled = aot_eager(fx.symbolic_trace(_scale_then_product), [torch.randn(8)] * 2)
    x = torch.randn(10, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        _scale_then_product(x[:8], x[2:])
    with pytest.warns(RuntimeWarning, match="runs? eagerly"):
        with pytest.raises(RuntimeError, match="leaf Variable"):
            compiled(x[:8], x[2:])


class _Accumulate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x)
        return self.total * x


def test_a_buffer_passed_as_the_argument_it_is_mutated_with():
    model, ref = _Accumulate(), _Accumulate()
    compiled = aot_eager(fx.symbolic_trace(model), [torch.ones(4)])
    gm = compiled.gm
    for step in range(4):
        x = torch.randn(4)
        got = compiled(gm.total if step % 2 else x.clone())
        expect = ref(ref.total if step % 2 else x.clone())
        torch.testing.assert_close(got, expect)
        torch.testing.assert_close(gm.total, ref.total)


_INPUT_VIEWS = {
    "view_as_complex": (lambda x: torch.view_as_complex(x), torch.float32),
    "view_as_real": (lambda z: torch.view_as_real(z), torch.complex64),
    "view_dtype": (lambda x: x.view(torch.int32), torch.float32),
    "view_narrower_dtype": (lambda x: x.view(torch.float16), torch.float32),
    "real": (lambda z: z.real, torch.complex64),
    "imag": (lambda z: z.imag, torch.complex64),
    "conj": (lambda z: z.conj(), torch.complex64),
    "conj_of_a_slice": (lambda z: z[1:].conj(), torch.complex64),
    "neg_view": (lambda x: torch._neg_view(x), torch.float32),
}


@pytest.mark.parametrize("backend", [aot_eager, aot_eager_decomp_partition])
@pytest.mark.parametrize("name", list(_INPUT_VIEWS))
def test_views_of_inputs_keep_their_dtype_and_lazy_bits(backend, name):
    """An output viewing an input in another dtype, or with a conjugate or negative bit,
    is the input's view as eager makes it (``as_strided`` keeps the input's dtype and bits)."""
    fn, dtype = _INPUT_VIEWS[name]
    x = torch.randn(4, 2, dtype=dtype)
    compiled = backend(fx.symbolic_trace(fn), [x])
    for _ in range(2):
        x = torch.randn(4, 2, dtype=dtype)
        out, want = compiled(x), fn(x)
        assert (out.dtype, out.shape, out.stride()) == (want.dtype, want.shape, want.stride())
        assert (out.is_conj(), out.is_neg()) == (want.is_conj(), want.is_neg())
        assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


def test_without_inputs_requiring_grad_the_grad_mode_shares_one_program():
    compiled = aot_eager(fx.symbolic_trace(lambda x: x.sin() * 2), [torch.randn(3)])
    with torch.no_grad():
        compiled(torch.randn(3))
    out = compiled(torch.randn(3))
    assert not out.requires_grad and len(compiled.variants()) == 1


@pytest.mark.parametrize("retain", [False, True])
def test_a_node_knows_its_saved_tensors_were_freed_as_reading_them_would_tell(retain):
    from kiln.autograd_aot import runtime

    seen = []

    class Node(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            ctx.maybe_clear_saved_tensors()
            try:
                ctx._raw_saved_tensors
                freed = False
            except RuntimeError:
                freed = True
            seen.append((runtime._saved_freed(ctx), freed))
            return g * 2

    Node.apply(torch.randn(3, requires_grad=True)).sum().backward(retain_graph=retain)
    assert seen == [(not retain, not retain)]
