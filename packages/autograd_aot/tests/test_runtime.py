"""The runtime wrapper: grad modes, retain_graph, double backward, RNG, module state."""

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
    assert not compiled._compiled[False].program.is_joint
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


def test_backward_makes_zeros_only_for_tangents_the_loss_does_not_reach():
    """Outputs the loss ignores (a second result, BatchNorm's new statistics) get no
    materialized zero gradient; a missing tangent of a differentiable output is made."""
    model, ref = _TwoOutputs(), _TwoOutputs()
    x = torch.randn(5, 4, requires_grad=True)
    compiled = aot_eager_decomp_partition(fx.symbolic_trace(model), [x])
    first, _ = compiled(x)
    with torch.profiler.profile() as prof:
        first.sum().backward()
    zeros = [e.name for e in prof.events() if e.name == "aten::zeros"]
    assert len(zeros) == 1  # the exp output's tangent
    got = x.grad
    x.grad = None
    ref(x)[0].sum().backward()
    torch.testing.assert_close(got, x.grad)


def test_switching_grad_mode_compiles_both_variants():
    gm = fx.symbolic_trace(nn.Linear(3, 2))
    x = torch.randn(4, 3)
    compiled = aot_eager(gm, [x])
    with torch.no_grad():
        compiled(x)
    compiled(x).sum().backward()
    assert set(compiled._compiled) == {True, False}
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


def test_double_backward_raises_clearly():
    x = torch.randn(5, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(lambda x: (x**3).sum()), [x])
    (g,) = torch.autograd.grad(compiled(x), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        g.sum().backward()


def test_outputs_that_do_not_require_grad():
    x = torch.randn(3, 4, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(lambda x: (x * 2, x.argmax(), x.detach() + 1)), [x])
    a, b, c = compiled(x)
    assert a.requires_grad and not b.requires_grad and not c.requires_grad
    assert b.dtype == torch.int64


def test_alias_output_is_a_view_of_the_input():
    x = torch.randn(3, 4, requires_grad=True)
    compiled = aot_eager(fx.symbolic_trace(lambda x: (x.t(), x * 2)), [x])
    view, _ = compiled(x)
    assert view._base is x
    view.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, 4))


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
    assert compiled._compiled[True].layout.groups == ((0, 1),)
    expect = fn(expect_base[:4].view(2, 2), expect_base[2:6], w)
    got = compiled(got_base[:4].view(2, 2), got_base[2:6], w)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(got_base, expect_base)
    assert got[1]._base is not None  # an alias of the input, as in eager
    (ge,) = torch.autograd.grad(expect[0].sum(), w)
    (gg,) = torch.autograd.grad(got[0].sum(), w)
    torch.testing.assert_close(gg, ge)


def test_mutated_input_sharing_memory_with_a_grad_input_is_rejected():
    from kiln.autograd_aot import AotError

    base = torch.randn(6, requires_grad=True) * 1

    def fn(a, b):
        a.add_(1)
        return b * 2

    with pytest.raises(AotError, match="share memory"):
        aot_eager(fx.symbolic_trace(fn), [base[:3], base[3:]])


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
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_on_cuda(check):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 4)).cuda()
    x = torch.randn(4, 8, device="cuda", requires_grad=True)
    compiled = check(model, [x], backend=aot_eager_decomp_partition)
    fw = compiled._compiled[True].forward
    vals = [n.meta["val"] for n in fw.graph.nodes if n.op == "call_function"]
    assert all(v.device.type == "cuda" for v in vals if isinstance(v, torch.Tensor))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
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
    assert compiled._compiled[True].program.num_user_outputs == 1
