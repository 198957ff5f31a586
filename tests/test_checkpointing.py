"""Activation checkpointing in one compiled graph, against eager.

``torch.utils.checkpoint.checkpoint`` (both forms), ``checkpoint_sequential`` and transformers'
``gradient_checkpointing_enable()`` are traced into the graph under ``fullgraph=True``; each
program runs several times on fresh inputs with each backend, and outputs and the gradients of
inputs and parameters must be eager's. The checkpointed ops are recomputed in the backward:
the tensors the compiled forward saves (seen by ``saved_tensors_hooks``) shrink as eager's do,
and a dropout mask drawn inside a region is the same when the backward recomputes it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import kiln
from kiln.autograd_aot.regions import REGION

BACKENDS = ["aot_eager", "kiln"]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


class Stack(nn.Module):
    """Blocks, each checkpointed (``mode``: "none", "plain", "reentrant", "sequential")."""

    def __init__(self, mode: str, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "sequential":
            return checkpoint_sequential(self.blocks, 2, x, use_reentrant=False).sin()
        for block in self.blocks:
            if self.mode == "none":
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.mode == "reentrant")
        return x.sin()


def _step(model: nn.Module, fn: Callable[..., Any], x: torch.Tensor) -> list[torch.Tensor]:
    """The output and the gradients of the input and every parameter."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out = fn(x)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return [out.detach(), x.grad, *(p.grad for p in model.parameters())]


def _no_fallback() -> None:
    assert kiln.counters.snapshot().get("stats", {}).get("eager_fallbacks", 0) == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["plain", "reentrant", "sequential"])
def test_checkpointed_blocks_match_eager(backend: str, mode: str) -> None:
    torch.manual_seed(0)
    model = Stack(mode)
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            x = torch.randn(6, 16)
            torch.testing.assert_close(_step(model, compiled, x), _step(model, model, x))
    _no_fallback()


def test_regions_are_marked_in_the_captured_graph() -> None:
    """One graph; each block's ops carry their own region id, the ops outside none."""
    model = Stack("plain", depth=3)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm

    kiln.compile(model, backend=backend, fullgraph=True)(torch.randn(2, 16))
    (gm,) = graphs
    ops = [n for n in gm.graph.nodes if n.op.startswith("call_")]
    regions = [n.meta.get(REGION) for n in ops]
    assert regions[-1] is None  # the final sin
    ids = list(dict.fromkeys(regions[:-1]))
    assert len(ids) == 3 and None not in ids
    assert regions[:-1] == [i for i in ids for _ in range(4)]


def _saved_activation_bytes(model: nn.Module, fn: Callable[..., Any], x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves during ``fn(x)`` that are neither the input nor a
    parameter (saving those keeps no extra memory alive)."""
    owned = {p.untyped_storage().data_ptr() for p in model.parameters()}
    owned.add(x.untyped_storage().data_ptr())
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if t.untyped_storage().data_ptr() not in owned:
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    out.sum().backward()
    return total


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpointing_saves_only_region_inputs(backend: str) -> None:
    """Checkpointed, the compiled forward saves about what eager's checkpointing saves (each
    block's input), a fraction of what it saves without."""
    torch.manual_seed(0)
    width, rows, depth = 32, 256, 4
    measured: dict[tuple[str, str], int] = {}
    for mode in ("none", "plain"):
        model = Stack(mode, width, depth)
        compiled = kiln.compile(model, backend=backend, fullgraph=True)
        x = torch.randn(rows, width, requires_grad=True)
        compiled(x)  # compiled outside the hooks
        measured[mode, "kiln"] = _saved_activation_bytes(model, compiled, x)
        measured[mode, "eager"] = _saved_activation_bytes(model, model, x)
    block_input = rows * width * 4
    # each later block's input and the input of the final sin
    assert measured["plain", "kiln"] == depth * block_input
    assert measured["plain", "kiln"] <= measured["plain", "eager"]
    assert measured["plain", "kiln"] * 4 < measured["none", "kiln"]
    assert measured["none", "kiln"] <= measured["none", "eager"]


class DropoutRegion(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(32) + 0.5)

    def region(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(x.exp(), 0.5, training=True) * self.scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = checkpoint(self.region, x, use_reentrant=False)
        return h, h.sin()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_mask_is_replayed_in_the_recomputation(backend: str) -> None:
    """The backward's recomputed mask is the forward's: the gradient vanishes exactly where
    the output was dropped, and elsewhere is the derivative through the kept mask."""
    model = DropoutRegion()
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    for _ in range(3):
        x = torch.randn(64, 32, requires_grad=True)
        h, out = compiled(x)
        out.sum().backward()
        kept = (h != 0).float()
        assert 0.3 < kept.mean().item() < 0.7
        assert x.grad is not None
        want = h.detach().cos() * kept * 2 * x.detach().exp() * model.scale.detach()
        torch.testing.assert_close(x.grad, want)
        model.zero_grad()
    _no_fallback()


def test_reentrant_without_grad_inputs_gives_no_parameter_gradients() -> None:
    """The reentrant form runs its function under no_grad when no input requires grad."""
    model = Stack("reentrant", depth=1)
    compiled = kiln.compile(model, fullgraph=True)
    x = torch.randn(3, 16)
    for fn in (compiled, model):
        with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
            out = fn(x)
        assert not out.requires_grad


CONTEXT_CALLS = [0]


def _context_fn() -> Any:
    CONTEXT_CALLS[0] += 1
    return torch.utils.checkpoint.noop_context_fn()


def test_custom_context_fn_breaks_the_graph() -> None:
    """A checkpoint Kiln does not trace (a context_fn) runs in torch, between two graphs."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.cos()
        y = checkpoint(lambda t: (t @ w).relu(), y, use_reentrant=False, context_fn=_context_fn)
        return y.sum(-1)

    explained = kiln.explain(fn)(torch.randn(3, 4), torch.randn(4, 4))
    assert explained.graph_break_count == 1
    assert "context_fn" in explained.breaks[0].explanation
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, fullgraph=True)(torch.randn(3, 4), torch.randn(4, 4))
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    CONTEXT_CALLS[0] = 0
    got = kiln.compile(fn)(x, w)
    got.sum().backward()
    assert CONTEXT_CALLS[0] == 1  # torch's checkpoint ran, with the user's context_fn
    grad = w.grad.clone()
    w.grad = None
    fn(x, w).sum().backward()
    torch.testing.assert_close(grad, w.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bert_gradient_checkpointing_is_one_graph(backend: str) -> None:
    """transformers' layers call ``checkpoint`` through a partial in training."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).train()
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 64, (2, 6))
    assert kiln.explain(model)(input_ids=ids).graph_count == 1
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    for _ in range(3):
        ids = torch.randint(0, 64, (2, 6))
        results = []
        for run in (compiled, model):
            out = run(input_ids=ids)
            loss = out.last_hidden_state.pow(2).mean() + out.pooler_output.sum()
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
            model.zero_grad()
        torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=1e-5)
    _no_fallback()


def test_bert_gradient_checkpointing_saves_less() -> None:
    """With dropout on: its masks are recomputed from saved seeds, not saved."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    ids = torch.randint(0, 64, (4, 64))
    measured = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = transformers.BertModel(config).train()
        if checkpointed:
            model.gradient_checkpointing_enable()
        compiled = kiln.compile(model, fullgraph=True)

        def run(ids: torch.Tensor, fn: Any = compiled) -> torch.Tensor:
            return fn(input_ids=ids).last_hidden_state

        run(ids)
        measured.append(_saved_activation_bytes(model, run, ids))
    assert measured[1] * 4 < measured[0]


def test_break_inside_the_region_runs_torch_checkpoint() -> None:
    """A function capture cannot trace whole runs under torch's own checkpoint."""
    calls: list[float] = []

    def region(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls.append(t.sum().item())  # a graph break: the region is left to torch
        return (t @ w).tanh() * 2

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return checkpoint(region, x.cos(), w, use_reentrant=False).sum(-1)

    assert kiln.explain(fn)(torch.randn(3, 4), torch.randn(4, 4)).graph_break_count >= 1
    compiled = kiln.compile(fn)
    for _ in range(2):
        x, w = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True)
        calls.clear()
        compiled(x, w).sum().backward()
        assert len(calls) == 2  # the forward, and torch's recomputation in the backward
        grad = w.grad
        w.grad = None
        fn(x, w).sum().backward()
        torch.testing.assert_close(grad, w.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_regions_keyword_arguments_and_no_grad(backend: str) -> None:
    """A region inside a region is recomputed with it; keyword arguments reach the
    function (non-reentrant form); under no_grad the checkpoint is a plain call."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def inner(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return lin(x).relu() * scale

    def outer(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(inner, x, use_reentrant=False, scale=2.0).tanh() + x

    def fn(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(outer, x, use_reentrant=False).sin().sum(-1)

    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(_step(lin, compiled, x), _step(lin, fn, x))
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), fn(x))
    _no_fallback()


def test_backward_rebuilds_each_region_when_its_gradients_need_it() -> None:
    """The backward graph recomputes the last region first and the first last, each just
    before its gradients, not every region's values at once."""
    from kiln.autograd_aot import aot_compile

    backwards: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        backwards.append(gm)
        return gm

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        return aot_compile(gm, inputs, fw_compiler=lambda g, _: g, bw_compiler=keep)

    model = Stack("plain", depth=3)
    x = torch.randn(4, 16, requires_grad=True)
    kiln.compile(model, backend=backend, fullgraph=True)(x).sum().backward()
    (bw,) = backwards
    nodes = list(bw.graph.nodes)
    first: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.op == "call_function" and REGION in n.meta:
            first.setdefault(n.meta[REGION], i)
    assert len(first) == 3
    order = sorted(first, key=first.__getitem__)
    assert order == sorted(first, reverse=True)
    gradient_ops = [
        i for i, n in enumerate(nodes) if n.op == "call_function" and REGION not in n.meta
    ]
    # the first region is rebuilt after the later regions' gradients were computed
    assert sum(1 for i in gradient_ops if i < first[order[-1]]) > 3
