"""torch.distributed inside compiled code, against eager, in a one-process gloo group.

``kiln.compile(DDP(model))`` runs DDP's own forward as eager does (its reducer, hooks and
``_DDPSink``) and compiles the wrapped model's forward as one graph: losses and gradients
(all-reduced by DDP's hooks) must be eager DDP's over several steps, with
``find_unused_parameters``, ``static_graph`` and ``no_sync``. FSDP2 modules (``fully_shard``)
run their hooks as eager does around compiled forwards. The in-place collectives
(``dist.all_reduce(t)``, ...) are traced as functional collectives, rank queries folded; each
program runs on fresh inputs and must give eager's values. Two processes (``torch.multiprocessing``,
gloo on CPU): ``test_distributed_ranks.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from kiln.capture.errors import Unsupported

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


@pytest.fixture(scope="module", autouse=True)
def _group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One gloo process group of one rank for the module's tests."""
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    yield
    kiln.reset()


class Recorder:
    """A backend keeping the graphs it is given, run as they are (``aot_eager`` stands in
    for the compile; the structure is what is checked)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward

    def ops(self, i: int) -> list[str]:
        return [str(getattr(n.target, "__name__", n.target)) for n in self.graphs[i].graph.nodes
                if n.op in ("call_function", "call_method", "call_module")]  # fmt: skip


class Net(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.unused = nn.Linear(3, 3) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _stats() -> Any:
    return kiln.stats()


def _train_both(
    compiled: Callable[..., Any],
    ref: Callable[..., Any],
    model: nn.Module,
    ref_model: nn.Module,
    steps: int = 3,
) -> None:
    """Steps of SGD on both: losses, gradients and parameters equal eager DDP's."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref_model)]
    for _ in range(steps):
        x = torch.randn(5, 8)
        losses = [f(x).pow(2).mean() for f in (compiled, ref)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[0], losses[1])
        for (name, p), q in zip(model.named_parameters(), ref_model.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def _pair(unused: bool = False, **ddp: Any) -> tuple[nn.Module, DDP, DDP]:
    torch.manual_seed(0)
    model = Net(unused)
    return model, DDP(model, **ddp), DDP(copy.deepcopy(model), **ddp)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_ddp_compiles_the_wrapped_model_as_one_graph(backend: str) -> None:
    model, wrapped, ref = _pair()
    _train_both(kiln.compile(wrapped, backend=backend), ref, model, ref.module)
    s = _stats()
    assert (s.graphs_compiled, s.graph_breaks, s.eager_fallbacks, s.recompiles) == (1, 0, 0, 0)
    assert "forward" not in vars(model)  # the compiled forward is the model's for a call only
    assert type(vars(wrapped)) is dict  # DDP's own attributes are not watched as a module tree


@pytest.mark.parametrize(
    # a one-byte bucket: a bucket per parameter (torch 2.11 refuses bucket_cap_mb=0)
    "options",
    [{"find_unused_parameters": True}, {"static_graph": True}, {"bucket_cap_mb": 1e-6}],
)
def test_ddp_options_match_eager(options: dict[str, Any]) -> None:
    model, wrapped, ref = _pair(unused="find_unused_parameters" in options, **options)
    _train_both(kiln.compile(wrapped, backend="aot_eager"), ref, model, ref.module, steps=4)
    assert (_stats().graphs_compiled, _stats().eager_fallbacks) == (1, 0)


class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("outer", [True, False])
def test_ddp_graph_splits_at_buckets_so_reductions_start_before_backward_ends(
    outer: bool, backend: str
) -> None:
    """A one-byte bucket: a piece per layer, each compiled on its own. DDP's communication
    hook, called as a bucket's gradients are all in, sees the first layer's gradient still
    missing when the last layer's bucket is reduced (one graph computes every gradient
    before any hook runs); huge buckets: one piece."""
    for cap, pieces in ((1e-6, 4), (1000, 1)):
        kiln.reset()
        torch.manual_seed(0)
        model = Deep()
        ref_model = copy.deepcopy(model)
        if outer:
            wrapped = DDP(model, bucket_cap_mb=cap)
            compiled: Callable[..., Any] = kiln.compile(wrapped, backend=backend)
        else:
            wrapped = DDP(kiln.compile(model, backend=backend), bucket_cap_mb=cap)
            compiled = wrapped
        first_missing: list[bool] = []

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
            first_missing.append(model.layers[0].weight.grad is None)  # noqa: B023
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        wrapped.register_comm_hook(None, hook)
        _train_both(compiled, DDP(ref_model, bucket_cap_mb=cap), model, ref_model, steps=3)
        s = _stats()
        assert (s.graphs_compiled, s.eager_fallbacks, s.ddp_graph_pieces) == (1, 0, pieces)
        # (DDP's first step reduces every gradient in one bucket, then builds its buckets)
        assert any(first_missing) is (pieces > 1), first_missing


def test_ddp_graph_holds_the_inner_forward_and_fullgraph_passes() -> None:
    recorder = Recorder()
    model, wrapped, ref = _pair()
    _train_both(kiln.compile(wrapped, backend=recorder, fullgraph=True), ref, model, ref.module)
    assert len(recorder.graphs) == 1
    assert recorder.ops(0) == ["linear", "relu", "linear"]
    explained = kiln.explain(wrapped)(torch.randn(5, 8))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_ddp_no_sync_accumulates_as_eager() -> None:
    model, wrapped, ref = _pair()
    compiled = kiln.compile(wrapped, backend="aot_eager")
    xs = [torch.randn(5, 8) for _ in range(3)]
    for f, m in ((compiled, wrapped), (ref, ref)):
        with m.no_sync():
            for x in xs[:2]:
                f(x).sum().backward()
        f(xs[2]).sum().backward()
    for p, q in zip(model.parameters(), ref.module.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_ddp_call_inside_a_function_splits_around_it() -> None:
    model, wrapped, ref = _pair()

    def step(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x * 2).tanh().sum()

    compiled = kiln.compile(step, backend="aot_eager")
    _train_both(lambda x: compiled(wrapped, x), lambda x: step(ref, x), model, ref.module)
    s = _stats()
    assert s.graph_break_kinds == {"distributed_module": 1}
    assert (s.graphs_compiled, s.eager_fallbacks) == (3, 0)  # before, inside, after
    with pytest.raises(Unsupported, match="distributed_module"):
        kiln.compile(step, fullgraph=True, backend="aot_eager")(wrapped, torch.randn(5, 8))


def _collectives(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2
    dist.all_reduce(y)
    dist.all_reduce(w, op=dist.ReduceOp.MAX)  # an input, written in place
    gathered = torch.empty(dist.get_world_size() * x.shape[0])
    dist.all_gather_into_tensor(gathered, x.sin())
    scattered = torch.empty(x.shape[0] // dist.get_world_size())
    dist.reduce_scatter_tensor(scattered, x.cos())
    size = dist.group.WORLD.size()  # type: ignore[union-attr]
    return y + dist.get_rank() + size, gathered, scattered


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_collectives_are_traced_into_the_graph(backend: str) -> None:
    recorder = Recorder()
    compiled = kiln.compile(_collectives, fullgraph=True, backend=recorder)
    for _ in range(3):
        x, w = torch.randn(4), torch.randn(4)
        w_eager = w.clone()
        torch.testing.assert_close(compiled(x, w), _collectives(x, w_eager))
        torch.testing.assert_close(w, w_eager)
    ops = recorder.ops(0)
    assert len(recorder.graphs) == 1 and ops.count("copy_") == 4
    collectives = [
        n.target
        for n in recorder.graphs[0].graph.nodes
        if isinstance(n.target, torch._ops.OpOverloadPacket | torch._ops.OpOverload)
        and "_c10d_functional" in str(n.target)
    ]
    names = ["all_reduce", "wait_tensor", "all_reduce", "wait_tensor"]
    names += ["all_gather_into_tensor", "wait_tensor", "reduce_scatter_tensor", "wait_tensor"]
    assert [t.__name__.split(".")[0] for t in collectives] == names
    if backend != "eager":
        run = kiln.compile(_collectives, fullgraph=True, backend=backend)
        x, w = torch.randn(4), torch.randn(4)
        w_eager = w.clone()
        torch.testing.assert_close(run(x, w), _collectives(x, w_eager))
        torch.testing.assert_close(w, w_eager)


def test_async_collective_breaks_and_runs_as_eager() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        dist.all_reduce(y, async_op=True).wait()  # type: ignore[union-attr]
        return y * 2

    explained = kiln.explain(fn)(torch.randn(3))
    assert [b.kind for b in explained.breaks][0] == "unsupported_call"
    assert "async_op=True" in explained.breaks[0].explanation
    compiled = kiln.compile(fn, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), fn(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.mark.parametrize("per_block", [False, True])
def test_fsdp2_hooks_run_around_compiled_forwards(per_block: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Stack()
    ref = copy.deepcopy(model)
    for m in (model, ref):
        if per_block:
            for block in m.blocks:
                fully_shard(block)
        fully_shard(m)
    compiled = kiln.compile(model, backend="aot_eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    for _ in range(3):
        x = torch.randn(5, 8)
        losses = [f(x).pow(2).mean() for f in (compiled, ref)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[0], losses[1])
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad.full_tensor())  # type: ignore[union-attr]
        for opt in opts:
            opt.step()
            opt.zero_grad()
    s = _stats()
    assert s.eager_fallbacks == 0
    # per block: each block's forward is compiled on its own, its call splits the root's
    assert s.graph_break_kinds == ({"distributed_module": 3} if per_block else {})
    assert s.graphs_compiled == (4 if per_block else 1)


def test_fsdp2_compiled_blocks_hand_over_and_keep_their_entries() -> None:
    """``kiln.compile`` of a ``fully_shard``-ed block calls the block's own Python with its
    forward compiled, without a frame (and a lookup) of its own in between: one lookup per
    block call. FSDP2 swaps the block's parameters on every call; the swapped-in tensors have
    the metadata the entry was built for, so every later call is a hit on the same entry."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model, ref = Stack(), Stack()
    ref.load_state_dict(model.state_dict())
    for m in (model, ref):
        for block in m.blocks:
            fully_shard(block)
        fully_shard(m)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = kiln.compile(block, backend="aot_eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]

    def steps(n: int) -> None:
        for _ in range(n):
            x = torch.randn(5, 8)
            losses = [f(x).pow(2).mean() for f in (model, ref)]
            for loss in losses:
                loss.backward()
            torch.testing.assert_close(losses[0], losses[1])
            for opt in opts:
                opt.step()
                opt.zero_grad()

    steps(2)
    before = _stats()
    assert (before.frames_captured, before.graphs_compiled) == (3, 3)  # Block.forward, per block
    steps(3)
    after = _stats()
    assert after.cache_misses == before.cache_misses
    assert after.cache_hits - before.cache_hits == 3 * 3  # one lookup per block call
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.full_tensor(), q.full_tensor())  # type: ignore[attr-defined]
    with kiln.disable():  # runs the block uncompiled: no lookup
        model(torch.randn(5, 8))
    assert _stats().cache_hits == after.cache_hits


def test_fsdp1_runs_its_own_python_around_the_compiled_module() -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = Net()
    ref_model = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="NO_SHARD"):  # (one rank: nothing to shard)
        wrapped, ref = FSDP(model, device_id="cpu"), FSDP(ref_model, device_id="cpu")
    compiled = kiln.compile(wrapped, backend="aot_eager")
    for _ in range(3):
        x = torch.randn(5, 8)
        losses = [f(x).pow(2).mean() for f in (compiled, ref)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[0], losses[1])
        for p, q in zip(wrapped.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    s = _stats()
    assert (s.graphs_compiled, s.graph_breaks, s.eager_fallbacks) == (1, 0, 0)
