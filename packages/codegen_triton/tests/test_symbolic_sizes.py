"""Triton kernels over symbolic sizes, under the interpreter: one compile serves every size.

Graphs are built as capture builds them (placeholders whose fakes have symbolic sizes) and
compiled by ``loopir.compile_fx`` with this backend. Each program is compiled at unusual
sizes (37, 53) and called at several more; outputs equal eager, nothing compiles again, and
no generated kernel holds a literal of a symbolic size.
"""

from __future__ import annotations

import logging
import re
import types
from collections.abc import Callable, Sequence

import pytest
import sympy
import torch
from torch import fx

from kiln.capture import counters
from kiln.capture.meta import FakeTensor
from kiln.capture.shapes import ShapeEnv, symbolic_meta
from kiln.capture.source import LocalSource
from kiln.codegen_triton import TritonBackend, TritonLaunchError, TritonOptions, cudagraphs
from kiln.codegen_triton.symbolic_launch import SymbolicLauncher
from kiln.codegen_triton.symbolic_sizes import bucket
from kiln.loopir import compile_fx
from kiln.loopir.kernel import KernelCode, KernelGroup
from kiln.loopir.scheduler.order import KernelStep


@pytest.fixture(params=["persistent", "looped"])
def backend(request: pytest.FixtureRequest) -> TritonBackend:
    limit = 1024 if request.param == "persistent" else 8
    return TritonBackend(TritonOptions(parallel_compile=False, persistent_reduction_limit=limit))


def _compile(
    fn: Callable[..., object],
    examples: Sequence[torch.Tensor],
    dims: Sequence[Sequence[int]],
    backend: TritonBackend,
) -> Callable[..., object]:
    """``fn`` traced with dims ``dims[i]`` of input ``i`` symbolic, compiled by loopir."""
    gm = fx.symbolic_trace(fn)
    env = ShapeEnv()
    for node, t, d in zip(gm.graph.find_nodes(op="placeholder"), examples, dims, strict=True):
        meta = symbolic_meta(t, LocalSource(node.name), env, dynamic_dims=d)
        node.meta["val"] = FakeTensor(meta, t.device, requires_grad=False)
    return compile_fx(gm, list(examples), backend=backend)


def _run(
    fn: Callable[..., object],
    make: Callable[[int, int], list[torch.Tensor]],
    dims: Sequence[Sequence[int]],
    backend: TritonBackend,
    caplog: pytest.LogCaptureFixture,
    sizes: Sequence[tuple[int, int]] = ((37, 53), (5, 19), (53, 37), (64, 3), (37, 53)),
    tol: float = 1e-5,
) -> str:
    """Compile at ``sizes[0]``, check every size against eager; the kernels' source."""
    counters.clear()
    with caplog.at_level(logging.INFO, logger="kiln.codegen_triton.output_code"):
        compiled = _compile(fn, make(*sizes[0]), dims, backend)
        kernels = counters.snapshot()["codegen_triton"]["kernels"]
        for n, m in sizes:
            inputs = make(n, m)
            got, expect = compiled(*inputs), fn(*inputs)
            torch.testing.assert_close(got, expect, atol=tol, rtol=tol)
    assert counters.snapshot()["codegen_triton"]["kernels"] == kernels, "compiled again"
    assert counters.snapshot()["autograd_aot"]["programs"] == 1
    text = caplog.text
    assert "def kiln_" in text
    for size in [s for s in sizes[0] if s > 1]:  # (a 0 stands for an unused size)
        assert not re.search(rf"\b{size}\b", text), f"size {size} is a literal in a kernel"
    return text


def _pointwise(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.sigmoid(x * 2.0) + y, (x - y).abs().sqrt(), torch.where(x > 0, x, y))


def test_pointwise(backend: TritonBackend, caplog: pytest.LogCaptureFixture) -> None:
    text = _run(
        _pointwise, lambda n, m: [torch.randn(n, m), torch.randn(n, m)], [(0, 1)] * 2, backend,
        caplog,
    )  # fmt: skip
    assert "xnumel, XBLOCK: tl.constexpr" in text  # a flat kernel needs no size but xnumel


def _broadcast(x: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x * row + col, (x + row).t().contiguous() * col.t())


def test_broadcasting(backend: TritonBackend, caplog: pytest.LogCaptureFixture) -> None:
    def make(n: int, m: int) -> list[torch.Tensor]:
        return [torch.randn(n, m), torch.randn(m), torch.randn(n, 1)]

    text = _run(_broadcast, make, [(0, 1), (0,), (0,)], backend, caplog)
    assert re.search(r"def kiln_\w+\(.*xnumel, s\d", text), "a size argument after xnumel"


def _reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x.sum(1), x.argmax(1), x.var(1), x.amax(0), torch.log_softmax(x, 0))


def test_reductions_of_odd_lengths(
    backend: TritonBackend, caplog: pytest.LogCaptureFixture
) -> None:
    # the interpreter runs a program per row: few, short rows keep it quick
    sizes = ((37, 53), (5, 19), (21, 7))
    text = _run(_reductions, lambda n, m: [torch.randn(n, m)], [(0, 1)], backend, caplog, sizes)
    # a row of symbolic length loops (no persistent block holds every admitted length)
    assert "for roffset in range(0, rnumel, RBLOCK)" in text


def _rows(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    normed = torch.nn.functional.layer_norm(x, (24,), w)
    return (torch.softmax(x, -1), normed, x.sum(-1))


def test_reductions_over_static_rows(
    backend: TritonBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows of static length (24) over a symbolic count: persistent with the 1024 limit."""
    persistent = backend.options.persistent_reduction_limit > 24
    text = _run(
        _rows, lambda n, m: [torch.randn(n, 24), torch.randn(24)], [(0,), ()], backend, caplog,
        ((37, 0), (5, 0), (53, 0)), tol=1e-4,
    )  # fmt: skip
    assert ("def kiln_per_" in text) == persistent
    assert ("for roffset" in text) != persistent


def _views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = x.shape[0]
    heads = x.view(n, 4, 6).transpose(0, 1).contiguous() * 2
    return (heads, x.reshape(-1)[3:].cos(), x[1:, 2:] + x[:-1, :-2], x[::2].sum(1))


def test_views_and_slices(backend: TritonBackend, caplog: pytest.LogCaptureFixture) -> None:
    _run(_views, lambda n, m: [torch.randn(n, 24)], [(0,)], backend, caplog)


def _slices(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.cat([x[1:], x[:1]], 0) * 2, x[:, 1:] - x[:, :-1], x.flip(0)[2:].sum(0))


def test_slices_of_symbolic_dims(backend: TritonBackend, caplog: pytest.LogCaptureFixture) -> None:
    _run(_slices, lambda n, m: [torch.randn(n, m)], [(0, 1)], backend, caplog)


class _Recording(TritonBackend):
    """The backend, keeping what it generated."""

    def __init__(self, opts: TritonOptions) -> None:
        super().__init__(opts)
        self.made: list[KernelCode] = []

    def codegen_kernel(self, group: KernelGroup) -> KernelCode:
        code = super().codegen_kernel(group)
        self.made.append(code)
        return code

    def launchers(self) -> list[SymbolicLauncher]:
        return [c.fn for c in self.made if isinstance(c.fn, SymbolicLauncher)]


def _recording() -> _Recording:
    return _Recording(TritonOptions(parallel_compile=False))


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def test_a_new_size_in_a_seen_bucket_tunes_nothing_new() -> None:
    backend = _recording()
    compiled = _compile(_softmax, [torch.randn(37, 53)], [(0, 1)], backend)
    for n, m in ((37, 53), (40, 50), (33, 60)):  # one bucket: rows, columns, elements
        x = torch.randn(n, m)
        torch.testing.assert_close(compiled(x), _softmax(x))
    launchers = backend.launchers()
    assert launchers, "no symbolic kernel found"
    assert all(len(lau._tuners) == 1 for lau in launchers)
    x = torch.randn(5, 200)
    torch.testing.assert_close(compiled(x), _softmax(x))
    assert all(len(lau._tuners) == 2 for lau in launchers)
    assert (bucket(37), bucket(64), bucket(65), bucket(1)) == (64, 64, 128, 1)


def test_a_new_bucket_near_a_tuned_one_takes_its_tuner() -> None:
    """``xnumel`` buckets within REUSE_SPAN of a tuned one (same ``rnumel`` bucket) share its
    tuner; one further away than that from every tuned bucket gets its own."""
    backend = _recording()
    compiled = _compile(_pointwise, [torch.randn(37, 53)] * 2, [(0, 1)] * 2, backend)
    for n in (37, 70, 140, 300, 1200):  # elements 1961, 3710, 7420, 15900, 63600
        x, y = torch.randn(n, 53), torch.randn(n, 53)
        torch.testing.assert_close(compiled(x, y), _pointwise(x, y))
    for launcher in backend.launchers():
        assert set(launcher._tuners) == {(b, 1) for b in (2048, 4096, 8192, 16384, 65536)}
        first, second = launcher._tuners[2048, 1], launcher._tuners[16384, 1]
        assert first is not second  # 16384 is 8 times 2048: tuned for itself
        assert launcher._tuners[4096, 1] is first and launcher._tuners[8192, 1] is first
        assert launcher._tuners[65536, 1] is second  # 4 times 16384, 32 times 2048


@pytest.mark.gpu
def test_other_size_patterns_launch_one_generic_binary_per_config() -> None:
    """Compiled at sizes that are no multiple of 16, called at ones that are (and back): those
    launch the config's generic binary, built once by the compile workers, not a binary per
    pattern; outputs equal eager."""
    backend = TritonBackend(TritonOptions(parallel_compile=True))
    recording = _Recording(backend.options)
    made = [torch.randn(37, 53, device="cuda")] * 2
    compiled = _compile(_pointwise, made, [(0, 1)] * 2, recording)
    for n, m in ((37, 53), (64, 32), (48, 16), (33, 17), (37, 53)):
        x, y = torch.randn(n, m, device="cuda"), torch.randn(n, m, device="cuda")
        torch.testing.assert_close(compiled(x, y), _pointwise(x, y))
    for launcher in recording.launchers():
        generic = [spec for spec in launcher._compiled if spec[-1] == "generic"]
        exact = [spec for spec in launcher._compiled if spec[-1] != "generic"]
        assert generic, "no generic binary was launched"
        divisible = [f[1] for spec in exact for f in spec if isinstance(f, tuple)]
        assert not any(divisible), f"a binary per pattern: {exact}"


def test_a_32_bit_kernel_refuses_sizes_past_2_to_the_31() -> None:
    backend = _recording()
    compiled = _compile(_pointwise, [torch.randn(37, 53)] * 2, [(0, 1)] * 2, backend)
    x = torch.randn(37, 53)
    compiled(x, x)
    launcher = backend.launchers()[0]
    assert not launcher.ks.int64
    t = torch.empty(1)
    with pytest.raises(TritonLaunchError, match="2\\*\\*31"):
        launcher(*[t] * launcher.count, *[2**16] * len(launcher.symbolic.args))


def test_a_static_graph_generates_what_it_did(caplog: pytest.LogCaptureFixture) -> None:
    """No symbol: no size arguments, the static launcher (the goldens hold the source)."""
    backend = _recording()
    with caplog.at_level(logging.INFO, logger="kiln.loopir.output_code"):
        compiled = _compile(_softmax, [torch.randn(37, 53)], [()], backend)
    x = torch.randn(37, 53)
    torch.testing.assert_close(compiled(x), _softmax(x))
    assert backend.made and not backend.launchers()
    assert all(c.size_args == () for c in backend.made)
    assert all(not re.search(r"xnumel, (rnumel, )?s\d", c.source) for c in backend.made)
    assert "def call(" in caplog.text and "s0 = " not in caplog.text


def test_a_symbolic_kernel_keeps_hints_for_heuristics() -> None:
    """Block sizes come from the compiled call's sizes: ``numel`` is the hint."""
    backend = _recording()
    _compile(_pointwise, [torch.randn(37, 53)] * 2, [(0, 1)] * 2, backend)
    (launcher, *_) = backend.launchers()
    assert launcher.ks.numel == 37 * 53 and launcher.symbolic.hints == (37, 53)
    assert {s.name for s in launcher.symbolic.numel.free_symbols} == {"s0", "s1"}


class _FakeRunner:
    """Records which sizes a CUDA graph would be recorded for (no GPU here)."""

    recorded: list[int] = []

    def __init__(self, fn: Callable[..., object], inputs: Sequence[torch.Tensor]) -> None:
        _FakeRunner.recorded.append(inputs[0].shape[0])

    def __call__(self, *args: torch.Tensor) -> None:
        return None


class _CudaTensor(torch.Tensor):
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def _symbolic_step() -> KernelStep:
    group = types.SimpleNamespace(
        name="kernel0", device=torch.device("cuda"), numel=sympy.Symbol("s0") * 4,
        rnumel=sympy.S.One, inputs=("x",), outputs=("buf0",),
    )  # fmt: skip
    step = KernelStep.__new__(KernelStep)
    object.__setattr__(step, "group", group)
    return step


def test_cuda_graphs_record_once_per_size_and_keep_the_latest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cudagraphs, "CudaGraphRunner", _FakeRunner)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cudagraphs, "GRAPHS_KEPT", 3)
    _FakeRunner.recorded = []

    def graph(*args: torch.Tensor) -> None:
        raise AssertionError("a safe graph replays")

    graph.steps = [_symbolic_step()]  # type: ignore[attr-defined]
    graph.input_names = ("x",)  # type: ignore[attr-defined]
    run = cudagraphs.cudagraphify(graph)
    for n in [5, 6, 5, 7, 8, 5, 6]:
        run(torch.randn(n, 4).as_subclass(_CudaTensor))
    # 5, 6, 7 recorded; 8 drops 6 (5 was used after it); 6 again is recorded again
    assert _FakeRunner.recorded == [5, 6, 7, 8, 6]
