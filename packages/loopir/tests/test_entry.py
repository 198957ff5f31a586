"""compile_fx, loopir's entry point: options routed, graph wrappers applied, training graphs."""

import logging
import operator

import pytest
import torch
from loopir_testing import aten_graph
from torch import fx

from kiln.loopir import (
    CompiledGraph,
    ReferenceBackend,
    compile_fx,
    entry,
    load_fx,
    register_graph_wrapper,
    save_fx,
)


class OptionsSeen(ReferenceBackend):
    """The reference backend, recording the options each graph was compiled with."""

    def __init__(self, seen=None):
        self.seen = [] if seen is None else seen

    def with_options(self, options):
        self.seen.append(dict(options))
        return self


def block(x, w):
    return torch.softmax(x @ w, dim=-1).sin() * 2


@pytest.fixture
def probe():
    wrapped = []

    def wrap(compiled):
        wrapped.append(compiled)

        def run(*args):
            return compiled(*args)

        return run

    register_graph_wrapper("probe", wrap)
    yield wrapped
    register_graph_wrapper("probe", None)


def test_options_reach_the_scheduler_the_wrapper_and_the_backend(probe):
    backend = OptionsSeen()
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8)
    opts = {"fusion": False, "probe": True, "cpp.threads": 1}
    compiled = compile_fx(fx.symbolic_trace(block), [x, w], backend=backend, options=opts)
    for _ in range(2):
        x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8)
        out = compiled(x, w)
        torch.testing.assert_close(out, block(x, w))
        (grad,) = torch.autograd.grad(out.sum(), x)
        (want,) = torch.autograd.grad(block(x, w).sum(), x)
        torch.testing.assert_close(grad, want)
    # one forward and one backward graph, each wrapped once, with the names of its inputs
    assert len(probe) == 2 and all(isinstance(c, CompiledGraph) for c in probe)
    assert probe[0].input_names[:2] == ("primals_1", "primals_2")
    # fusion and the wrapper's option are loopir's; the backend sees only its own keys
    assert backend.seen == [{"cpp.threads": 1}, {"cpp.threads": 1}]
    assert opts == {"fusion": False, "probe": True, "cpp.threads": 1}


def test_a_wrapper_option_set_false_is_not_applied_nor_passed_on(probe):
    backend = OptionsSeen()
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    compiled = compile_fx(
        fx.symbolic_trace(block), [x, w], backend=backend, options={"probe": False}
    )
    torch.testing.assert_close(compiled(x, w), block(x, w))
    assert probe == [] and backend.seen == []


def test_a_wrapper_that_cannot_be_imported_is_skipped_with_one_warning(monkeypatch, caplog):
    monkeypatch.setitem(entry.GRAPH_WRAPPERS, "ghost", "kiln_absent_wrapper_module:wrap")
    monkeypatch.setattr(entry, "_unavailable", {})
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with caplog.at_level(logging.WARNING, logger="kiln.loopir.entry"):
        for _ in range(2):
            compiled = compile_fx(
                fx.symbolic_trace(block), [x, w], backend=ReferenceBackend(), options={"ghost": 1}
            )
            torch.testing.assert_close(compiled(x, w), block(x, w))
    warnings = [r for r in caplog.records if "kiln_absent_wrapper_module" in r.getMessage()]
    assert len(warnings) == 1 and "'ghost'" in warnings[0].getMessage()


def test_rewrites_run_before_autograd():
    # written-out attention becomes one fused call before the graph is traced to ATen
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1) @ v

    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    gm = aten_graph(attention, q, k, v)
    compiled = compile_fx(gm, [q, k, v], backend=ReferenceBackend())
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.nn.functional.scaled_dot_product_attention in targets
    torch.testing.assert_close(compiled(q, k, v), attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_lazy_conjugate_inputs_run_the_captured_graph():
    def f(z):
        return z * 2

    gm = fx.symbolic_trace(f)
    z = torch.randn(3, dtype=torch.cfloat).conj()
    compiled = compile_fx(gm, [z], backend=ReferenceBackend())
    assert compiled == gm.forward
    torch.testing.assert_close(compiled(z), f(z))


def _causal_attention() -> fx.GraphModule:
    """``sdpa(q, k, v, attn_mask=arange(16)[cols] <= arange(16)[rows])``, built by hand: tracing
    would fold the mask of constants into a tensor constant."""
    g = fx.Graph()
    q, k, v = (g.placeholder(name) for name in "qkv")
    i = g.call_function(torch.arange, (16,))
    rows = g.call_function(operator.getitem, (i, (None, None, slice(None), None)))
    cols = g.call_function(operator.getitem, (i, (None, None, None, slice(None))))
    mask = g.call_function(operator.le, (cols, rows))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    g.output(g.call_function(sdpa, (q, k, v), {"attn_mask": mask}))
    return fx.GraphModule(torch.nn.Module(), g)


def _masked(gm: fx.GraphModule) -> bool:
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return any(n.kwargs.get("attn_mask") is not None for n in gm.graph.nodes if n.target is sdpa)


def test_a_loaded_program_rewrites_its_graph_only_when_it_traces_it_again():
    # the constant causal mask is evaluated by a rewrite, which a load defers
    eager = _causal_attention()
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    with torch.no_grad():
        expected = eager(q, k, v)
        data = save_fx(compile_fx(_causal_attention(), [q, k, v]))
        assert b"reduce_graph_module" not in data  # no graph stored as code, rebuilt on load
        gm = _causal_attention()
        loaded = load_fx(data, gm, [q, k, v])
        torch.testing.assert_close(loaded(q, k, v), expected)
    assert _masked(gm)  # the stored program ran: the graph was never rewritten
    # another grad mode traces the graph: rewritten first, as a compile would have it
    q.requires_grad_()
    out = loaded(q, k, v)
    assert not _masked(gm)
    torch.testing.assert_close(out, eager(q, k, v))
    (grad,) = torch.autograd.grad(out.sum(), q)
    (expected_grad,) = torch.autograd.grad(eager(q, k, v).sum(), q)
    torch.testing.assert_close(grad, expected_grad)
