"""torch.distributed met by capture alone (no frontend), in a one-process gloo group.

A call of a DDP module hands over to the wrapped module's forward, captured on its own
through ``wrap_callable`` (no break recorded for a frame that is only that call; a
``distributed_module`` break otherwise); in-place collectives are traced as functional
collectives copied back; rank queries fold to guarded constants.
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

from kiln.capture import GraphBreak, GuardKind, capture
from kiln.capture.explain import op_names
from kiln.capture.parallel_modules import BucketCaps, active_ddp_buckets

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


@pytest.fixture(scope="module", autouse=True)
def _group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Harness:
    """Captures a function and every callee handed to ``wrap_callable``, on every call."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.breaks: list[GraphBreak] = []
        self.guards: list[Any] = []

    def compile_graph(self, gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = capture(
                fn, args, kwargs, compile_graph=self.compile_graph, wrap_callable=self.wrap
            )
            self.breaks.extend(result.graph_breaks)
            self.guards.extend(result.guards)
            return result.function(*args, **kwargs)

        return call


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_ddp_call_hands_over_to_the_wrapped_forward() -> None:
    model = _net()
    wrapped, ref = DDP(model), DDP(copy.deepcopy(model))

    def run(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x)

    harness = Harness()
    for _ in range(2):
        x = torch.randn(3, 6)
        harness.wrap(run)(wrapped, x).sum().backward()
        run(ref, x).sum().backward()
        for p, q in zip(model.parameters(), ref.module.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
    assert harness.breaks == []  # the frame is only the call: nothing is split
    assert [op_names(g) for g in harness.graphs] == [["linear", "relu", "linear"]] * 2


def test_a_ddp_call_among_other_work_is_a_break() -> None:
    wrapped = DDP(_net())

    def run(x: torch.Tensor) -> torch.Tensor:
        return wrapped(x.sin()).cos()

    harness = Harness()
    x = torch.randn(3, 6)
    torch.testing.assert_close(harness.wrap(run)(x), run(x))
    assert [b.kind for b in harness.breaks] == ["distributed_module"]
    assert [op_names(g) for g in harness.graphs] == [["sin"], ["linear", "relu", "linear"], ["cos"]]


def test_in_place_collectives_and_rank_queries_are_traced() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x + dist.get_rank()
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        return y * dist.get_world_size()

    harness = Harness()
    x = torch.randn(5)
    torch.testing.assert_close(harness.wrap(fn)(x), fn(x))
    assert harness.breaks == []
    assert op_names(harness.graphs[0]) == ["add", "all_reduce", "wait_tensor", "copy_", "mul"]
    assert sum(g.kind is GuardKind.CACHED_CALL for g in harness.guards) == 2


@pytest.mark.parametrize(
    ("options", "first", "rest"),
    [({}, 1 << 20, 25 << 20), ({"bucket_cap_mb": 2}, 2 << 20, 2 << 20)],
)
def test_active_ddp_buckets_are_read_during_its_forward(
    options: dict[str, Any], first: int, rest: int
) -> None:
    """DDP's own sizes: the default cap starts with a 1 MiB bucket, a cap given is every
    bucket's; ignored parameters listed; nothing outside a DDP forward."""
    model = _net()
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["0.bias"])
    seen: list[BucketCaps | None] = []
    model.register_forward_pre_hook(lambda m, args: seen.append(active_ddp_buckets()))
    DDP(model, **options)(torch.randn(3, 6))
    ignored = frozenset({id(model[0].bias)})
    assert seen == [BucketCaps(first, rest, ignored)]
    assert active_ddp_buckets() is None
