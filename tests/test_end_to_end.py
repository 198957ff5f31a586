"""kiln.compile end to end: capture, guards, backends and the frontend's call path together."""

from __future__ import annotations

import time

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def toy_body(a, b):
    x = a / (torch.abs(a) + 1)
    return x * 2 + b


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_function_matches_eager_and_caches(backend):
    f = kiln.compile(toy_body, backend=backend)
    a, b = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(f(a, b), toy_body(a, b))
    a2, b2 = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(f(a2, b2), toy_body(a2, b2))
    s = kiln.stats()
    assert s.frames_captured == 1
    assert s.graphs_compiled == 1
    assert s.cache_hits == 1
    assert s.eager_fallbacks == 0


def test_decorator_forms_and_methods():
    @kiln.compile
    def f(x):
        return x.sin() + 1

    @kiln.compile(backend="eager", fullgraph=True)
    def g(x):
        return x.cos() * 2

    class Holder:
        def __init__(self):
            self.w = torch.randn(5)

        @kiln.compile(backend="eager")
        def apply(self, x):
            return x * self.w

    x = torch.randn(5)
    torch.testing.assert_close(f(x), x.sin() + 1)
    torch.testing.assert_close(g(x), x.cos() * 2)
    h = Holder()
    torch.testing.assert_close(h.apply(x), x * h.w)
    bound = kiln.compile(h.apply.original.__get__(h), backend="eager")
    torch.testing.assert_close(bound(x), x * h.w)


def test_module_compiles_and_follows_train_eval():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.ReLU())
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(4, 8)
    compiled.eval()
    torch.testing.assert_close(compiled(x), model(x))
    with torch.no_grad():
        model[0].weight.add_(1.0)  # in-place update: same entry, new values
    torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats().frames_captured == 1


def test_shape_change_recompiles_never_stale():
    f = kiln.compile(toy_body, backend="eager")
    for n in (4, 8, 4):
        a, b = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(f(a, b), toy_body(a, b))
    assert kiln.stats().frames_captured == 2


def test_disable_runs_uncompiled():
    f = kiln.compile(toy_body, backend="eager")
    a, b = torch.randn(3), torch.randn(3)
    with kiln.disable():
        torch.testing.assert_close(f(a, b), toy_body(a, b))
    assert kiln.stats().frames_captured == 0


def test_backend_failure_falls_back_with_one_warning():
    def broken(gm, inputs):
        raise RuntimeError("backend exploded")

    f = kiln.compile(toy_body, backend=broken)
    a, b = torch.randn(3), torch.randn(3)
    with pytest.warns(RuntimeWarning, match="backend exploded"):
        out = f(a, b)
    torch.testing.assert_close(out, toy_body(a, b))
    with pytest.raises(kiln.CompileError, match="backend exploded"):
        kiln.compile(toy_body, backend=broken, fullgraph=True)(a, b)


def test_user_error_surfaces_unchanged():
    def bad(a, b):
        return a + b

    f = kiln.compile(bad, backend="eager")
    with pytest.raises(RuntimeError, match="size of tensor"):
        f(torch.randn(3), torch.randn(4))


def test_custom_backend_receives_graph_and_real_inputs():
    seen = []

    def spy(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    f = kiln.compile(toy_body, backend=spy)
    a, b = torch.randn(6), torch.randn(6)
    f(a, b)
    ((gm, inputs),) = seen
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.abs in targets
    assert any(isinstance(t, torch.Tensor) and t.shape == (6,) for t in inputs)


def test_stats_and_reset():
    f = kiln.compile(toy_body, backend="eager")
    f(torch.randn(2), torch.randn(2))
    assert kiln.stats().frames_captured == 1
    kiln.reset()
    assert kiln.stats().frames_captured == 0
    f(torch.randn(2), torch.randn(2))  # the function remembered its cache: reset dropped it
    assert kiln.stats().frames_captured == 1


def test_compile_seconds_split_a_compile_by_step(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")  # every step runs, none is loaded
    kiln.reset()
    start = time.perf_counter()
    f = kiln.compile(lambda x: (x.sin() * 2).sum(0))
    x = torch.randn(4, 8)
    torch.testing.assert_close(f(x), (x.sin() * 2).sum(0))
    took = time.perf_counter() - start
    steps = kiln.stats().compile_seconds
    for step in ("capture", "guards", "autograd_aot", "loopir.lower", "loopir.schedule"):
        assert steps[step] > 0, step
    assert "cpp.build" in steps  # a build, or a load from the kernel cache
    # each step's time leaves out the steps inside it: together they are the compile's time
    assert sum(steps.values()) <= took
    f(torch.randn(4, 8))
    assert kiln.stats().compile_seconds == steps  # a cache hit compiles nothing
    kiln.reset()
    assert kiln.stats().compile_seconds == {}


def test_closures_of_one_def_never_share_entries():
    def make(k):
        def scaled(x):
            return x * k

        return scaled

    x = torch.randn(4)
    for k in (2.0, 3.0, 2.0):
        f = kiln.compile(make(k), backend="eager")
        torch.testing.assert_close(f(x), x * k)


def test_backends_never_share_entries():
    seen = []

    def spy(gm, inputs):
        seen.append(gm)
        return gm.forward

    a, b = torch.randn(3), torch.randn(3)
    kiln.compile(toy_body, backend="eager")(a, b)
    kiln.compile(toy_body, backend=spy)(a, b)
    assert len(seen) == 1


def test_fullgraph_raises_even_after_a_non_fullgraph_fallback():
    def broken(gm, inputs):
        raise RuntimeError("backend exploded")

    a, b = torch.randn(3), torch.randn(3)
    with pytest.warns(RuntimeWarning):
        kiln.compile(toy_body, backend=broken)(a, b)
    with pytest.raises(kiln.CompileError):
        kiln.compile(toy_body, backend=broken, fullgraph=True)(a, b)


def test_recompiles_are_counted():
    f = kiln.compile(toy_body, backend="eager")
    f(torch.randn(3), torch.randn(3))
    f(torch.randn(5), torch.randn(5))
    assert kiln.stats().recompiles == 1


def test_skip_guards_reuses_the_newest_entry_unchecked():
    f = kiln.compile(toy_body, backend="eager", options={"skip_guards": True})
    f(torch.randn(3), torch.randn(3))
    f(torch.randn(3), torch.randn(3))
    assert kiln.stats().frames_captured == 1 and kiln.stats().cache_hits == 1


def test_recompile_limit_runs_eagerly_with_one_warning():
    f = kiln.compile(toy_body, backend="eager", dynamic=False, options={"recompile_limit": 2})
    with pytest.warns(RuntimeWarning, match="recompile limit"):
        for n in range(2, 7):
            a, b = torch.randn(n), torch.randn(n)
            torch.testing.assert_close(f(a, b), toy_body(a, b))
    assert kiln.stats().frames_captured == 2
    with pytest.raises(kiln.KilnError):
        g = kiln.compile(
            toy_body,
            backend="eager",
            dynamic=False,
            options={"recompile_limit": 1, "fail_on_recompile_limit": True},
        )
        g(torch.randn(2), torch.randn(2))
        g(torch.randn(3), torch.randn(3))


class _LayerDropStack(torch.nn.Module):
    """HuggingFace's LayerDrop: a data-dependent branch in every iteration of the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(12))
        self.layerdrop = 0.0

    def forward(self, x):
        for layer in self.layers:
            if torch.rand([]) < self.layerdrop:
                continue
            x = torch.relu(layer(x))
        return x


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_a_loop_breaking_in_every_layer_compiles_every_layer(backend, recwarn):
    """Each layer's continuation is an entry for another module object: 12 layers stay
    under a recompile limit of 8, so none of them runs eagerly."""
    model = _LayerDropStack()
    f = kiln.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(4, 8)
        torch.testing.assert_close(f(x), model(x))
    assert not [w for w in recwarn if "recompile limit" in str(w.message)]
    assert "limit_eager_runs" not in kiln.counters.snapshot().get("guards", {})
    assert kiln.stats().graph_breaks >= 12 and kiln.stats().eager_fallbacks == 0


def test_debug_dir_gets_one_folder_per_frame_with_artifacts(tmp_path):
    f = kiln.compile(toy_body, options={"debug_dir": str(tmp_path)})
    f(torch.randn(4), torch.randn(4))
    (frame,) = tmp_path.iterdir()
    names = {p.name for p in frame.iterdir()}
    assert "graph.py" in names and "guards.py" in names and "output_code.py" in names
    assert any(n.endswith(".cpp") for n in names)
    assert "torch.abs" in (frame / "graph.py").read_text()


def test_explain_is_reexported():
    def f(a, b):
        x = a / (torch.abs(a) + 1)
        if b.sum() < 0:
            b = b * -1
        return x * b

    out = kiln.explain(f)(torch.randn(4), torch.randn(4))
    assert "graph" in str(out).lower()
