"""Compiling and calling compiled code from many threads at once.

Every thread's results must equal eager, nothing may fall back to eager, and each shape gets
exactly one cache entry however many threads missed on it together.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kiln
from kiln import api

THREADS = 8
SHAPES = (1, 2, 3, 4, 5, 6)
# Calls per thread in the stress test (fewer for a quick local run: every shape still
# compiles concurrently, as each thread starts on a different model and shape).
CALLS = int(os.environ.get("KILN_THREAD_STRESS_CALLS", "200"))


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.conv(x)).mean(dim=(2, 3)))


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)
        return self.out(weights @ v) + x


def _inputs(model: torch.nn.Module, n: int) -> torch.Tensor:
    if isinstance(model, _ConvNet):
        return torch.randn(n, 3, 5, 5)
    if isinstance(model, _Attention):
        return torch.randn(2, n + 1, 8)
    return torch.randn(n, 8)


def _entries(compiled: Any) -> int:
    fn = compiled._kiln_call if isinstance(compiled, kiln.OptimizedModule) else compiled
    return len(api._caches[fn._cache_key].entries)


def _run_threads(work: Callable[[int], None], threads: int = THREADS) -> None:
    """Run ``work(i)`` in ``threads`` threads released together; re-raise the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def body(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as e:
            errors.append(e)

    pool = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("backend", ["kiln"])
def test_many_threads_compile_and_call_three_models(backend):
    torch.manual_seed(0)
    models = [_MLP().eval(), _ConvNet().eval(), _Attention().eval()]
    compiled = [kiln.compile(m, backend=backend, dynamic=False) for m in models]
    calls = CALLS

    def work(i: int) -> None:
        gen = torch.Generator().manual_seed(i)
        for j in range(calls):
            # Every thread starts on a different shape of a different model, so compiles of
            # all three models and of several shapes overlap.
            which = (i + j) % len(models)
            n = SHAPES[(i + j // len(models)) % len(SHAPES)]
            torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
            x = _inputs(models[which], n)
            with torch.no_grad():
                torch.testing.assert_close(compiled[which](x), models[which](x))

    started = time.perf_counter()
    with torch.no_grad():
        _run_threads(work)
    elapsed = time.perf_counter() - started
    s = kiln.stats()
    assert s.eager_fallbacks == 0, s
    assert s.graph_breaks == 0, s
    for c in compiled:
        assert _entries(c) == len(SHAPES)
    assert s.frames_captured == len(models) * len(SHAPES)
    assert s.recompiles == len(models) * (len(SHAPES) - 1)
    assert s.cache_hits + s.cache_misses == THREADS * calls
    assert elapsed < 120


def _slow_backend(calls: list[int]) -> Callable[..., Any]:
    """An eager backend that takes a while, so threads that miss together overlap in it."""

    def slow(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        calls.append(1)
        time.sleep(0.3)
        return gm.forward

    return slow


def _body(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def test_threads_missing_together_compile_once():
    compiled_graphs: list[int] = []
    f = kiln.compile(_body, backend=_slow_backend(compiled_graphs), dynamic=False)

    def work(i: int) -> None:
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(f(x), _body(x))

    _run_threads(work)
    s = kiln.stats()
    assert len(compiled_graphs) == 1 and s.frames_captured == 1 and s.recompiles == 0
    assert _entries(f) == 1
    assert s.cache_misses == 1 and s.cache_hits == THREADS * 3 - 1


def test_threads_missing_on_different_shapes_count_real_recompiles_only():
    compiled_graphs: list[int] = []
    f = kiln.compile(
        _body,
        backend=_slow_backend(compiled_graphs),
        dynamic=False,
        options={"recompile_limit": len(SHAPES)},
    )

    def work(i: int) -> None:
        for j in range(len(SHAPES)):
            x = torch.randn(SHAPES[(i + j) % len(SHAPES)])
            torch.testing.assert_close(f(x), _body(x))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the recompile limit is never reached
        _run_threads(work, threads=4)
    s = kiln.stats()
    assert len(compiled_graphs) == len(SHAPES) and _entries(f) == len(SHAPES)
    assert s.recompiles == len(SHAPES) - 1 and s.eager_fallbacks == 0


def test_calls_that_hit_run_while_another_thread_compiles():
    compiled_graphs: list[int] = []
    f = kiln.compile(_body, backend=_slow_backend(compiled_graphs), dynamic=False)
    f(torch.randn(3))
    compiling = threading.Event()
    done = threading.Event()
    hits_meanwhile = [0]

    def work(i: int) -> None:
        if i == 0:
            compiling.set()
            f(torch.randn(7))  # a new shape: compiles for 0.3 s
            done.set()
            return
        compiling.wait()
        while not done.is_set():
            x = torch.randn(3)
            torch.testing.assert_close(f(x), _body(x))
            hits_meanwhile[0] += 1

    _run_threads(work, threads=4)
    assert len(compiled_graphs) == 2 and _entries(f) == 2
    assert hits_meanwhile[0] > 0


def test_a_frame_past_the_recompile_limit_counts_as_an_eager_fallback():
    f = kiln.compile(_body, backend="eager", dynamic=False, options={"recompile_limit": 2})
    with pytest.warns(RuntimeWarning, match="recompile limit"):
        for n in range(2, 7):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), _body(x))
    s = kiln.stats()
    assert s.frames_captured == 2
    assert s.eager_fallbacks == 1  # one frame runs eagerly (counted once, like a failed one)


def test_a_backend_failure_seen_by_threads_missing_together_falls_back_once():
    tried: list[int] = []

    def failing(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        tried.append(1)
        time.sleep(0.3)
        raise RuntimeError("backend broke")

    f = kiln.compile(_body, backend=failing, dynamic=False)

    def work(i: int) -> None:
        x = torch.randn(5)
        torch.testing.assert_close(f(x), _body(x))

    with pytest.warns(RuntimeWarning, match="backend failed on a graph"):
        _run_threads(work)
    assert len(tried) == 1 and _entries(f) == 1
    assert kiln.stats().eager_fallbacks == 1


def test_threads_compile_and_train_with_gradients_equal_to_eager():
    torch.manual_seed(0)
    model = _MLP()
    compiled = kiln.compile(model, dynamic=False)
    params = list(model.parameters())

    def work(i: int) -> None:
        for j in range(8):
            x = torch.randn(SHAPES[(i + j) % 4], 8)
            out, ref = compiled(x), model(x)
            torch.testing.assert_close(out, ref)
            got = torch.autograd.grad(out.square().sum(), params)
            want = torch.autograd.grad(ref.square().sum(), params)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b)

    _run_threads(work, threads=4)
    s = kiln.stats()
    assert s.eager_fallbacks == 0 and s.frames_captured == 4 and _entries(compiled) == 4
