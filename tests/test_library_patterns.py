"""Code patterns of model libraries (transformers' modeling files) captured in one graph.

Each test writes the library's pattern as user code, compiles it with ``kiln.compile`` and
checks it against eager over several calls with changing inputs, and counts graphs and
breaks with ``kiln.explain``.
"""

from __future__ import annotations

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _one_graph(fn, *args):
    report = kiln.explain(fn)(*args)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)


class BufferMovedInForward(torch.nn.Module):
    """A buffer rebound in ``forward`` to the input's dtype (transformers' CTRL)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(16, 4), persistent=False)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.table = self.table.to(dtype=x.dtype)
        return self.proj(x + self.table[ids, :])


class BufferUpdatedInForward(torch.nn.Module):
    """A buffer replaced by a new tensor on every call, and set to None and back."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("scratch", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.running = self.running * 0.5 + x.mean(0)
        self.scratch = x.sum(0)
        out = x - self.running + self.scratch
        self.scratch = None
        return out


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_buffer_rebound_in_forward(backend):
    torch.manual_seed(0)
    m = BufferMovedInForward()
    ids = torch.randint(0, 16, (3,))
    _one_graph(m, ids, torch.randn(3, 4))
    compiled = kiln.compile(m, backend=backend)
    for dtype in (torch.float32, torch.float32, torch.float64, torch.float64):
        m.double() if dtype is torch.float64 else m.float()
        ids, x = torch.randint(0, 16, (3,)), torch.randn(3, 4, dtype=dtype)
        expected = m(ids, x)
        torch.testing.assert_close(compiled(ids, x), expected)
        assert m.table.dtype == dtype and "table" in m._buffers


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_buffer_replaced_each_call(backend):
    eager, m = BufferUpdatedInForward(), BufferUpdatedInForward()
    _one_graph(BufferUpdatedInForward(), torch.randn(2, 4))
    compiled = kiln.compile(m, backend=backend)
    for _ in range(4):
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), eager(x))
        torch.testing.assert_close(m.running, eager.running)
        assert m.scratch is None and set(m._buffers) == {"running", "scratch"}


class CallsModuleCall(torch.nn.Module):
    """A layer whose ``__call__`` calls ``nn.Module.__call__`` through ``super()``
    (transformers' GradientCheckpointingLayer): capture inlines ``_call_impl``, which reads
    the hook dicts that kiln.guards watches once a compiled call has seen the module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs)

    def forward(self, x):
        return self.lin(x).relu()


def test_module_call_through_super_reads_watched_hook_dicts():
    model = torch.nn.Sequential(CallsModuleCall(), CallsModuleCall()).train()
    compiled = kiln.compile(model, dynamic=False)
    for rows in (2, 3, 2, 4):  # new sizes compile again, now with the hook dicts watched
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x), model(x))
    stats = kiln.stats()
    assert stats.graph_breaks == 0, stats
    assert stats.recompiles == 2, stats  # one per new size: watching the dicts changed no type
    _one_graph(model, torch.randn(5, 4))


class Recurrent(torch.nn.Module):
    """An LSTM and a GRU (timm's Sequencer runs bidirectional LSTMs over rows and columns).
    ``nn.RNNBase.forward`` checks its weights against weak references to them, to see
    whether one was swapped since its last call."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = torch.nn.GRU(16, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.lstm(x)[0].relu())[0]


def test_recurrent_modules_in_one_graph_follow_a_swapped_weight():
    torch.manual_seed(0)
    m = Recurrent()
    _one_graph(m, torch.randn(2, 5, 6))
    compiled = kiln.compile(m)
    for step in range(4):
        if step == 2:  # a new weight object: the weak reference no longer points at it
            with torch.no_grad():
                m.lstm.weight_hh_l1 = torch.nn.Parameter(torch.randn_like(m.lstm.weight_hh_l1))
        x = torch.randn(2, 5, 6)
        expected = m(x)
        expected.sum().backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        got = compiled(x)
        torch.testing.assert_close(got, expected)
        got.sum().backward()
        for p, want in zip(m.parameters(), grads, strict=True):
            torch.testing.assert_close(p.grad, want)
        m.zero_grad()
    stats = kiln.stats()
    assert stats.recompiles >= 1, stats  # the swapped weight's identity is guarded
