"""Unbacked symbols: data-dependent values on fakes (``shapes/unbacked.py``, the env's
unbacked symbols) and in captured graphs (``capture_scalar_outputs``,
``capture_dynamic_output_shape_ops``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import sympy
import torch

from kiln.capture import capture, dynamic_dims
from kiln.capture.dynamic_dims import DynamicDims
from kiln.capture.errors import Unsupported
from kiln.capture.meta import DataDependentOp, FakeMode
from kiln.capture.shapes import ShapeEnv, unbacked
from kiln.capture.shapes.env import DataDependentGuard
from kiln.capture.shapes.exprs import Range


@pytest.fixture
def env() -> Iterator[ShapeEnv]:
    shapes = ShapeEnv()
    with unbacked.allowing(unbacked.DataDependentOps(shapes, scalars=True, shapes=True)):
        yield shapes


def test_nonzero_row_count_is_an_unbacked_size_ranged_by_numel(env: ShapeEnv) -> None:
    with FakeMode() as mode:
        rows = torch.nonzero(mode.to_fake(torch.randn(3, 4)) > 0)
    (n, dims) = rows.shape
    assert dims == 2 and isinstance(n, torch.SymInt)
    symbol = n.node.expr
    assert env.unbacked[symbol] == Range(0, 12) and symbol in env.size_like
    assert rows.stride() == (1, n)  # column by column, as eager's kernel lays it out


def test_item_is_an_unbacked_number_by_dtype(env: ShapeEnv) -> None:
    with FakeMode() as mode:
        n = mode.to_fake(torch.tensor(3)).item()
        flag = mode.to_fake(torch.tensor(True)).item()
        scale = mode.to_fake(torch.tensor(0.5)).item()
    assert isinstance(n, torch.SymInt) and n.node.hint is None
    assert isinstance(flag, torch.SymBool)
    assert isinstance(scale, torch.SymFloat)


def test_a_decision_the_ranges_do_not_settle_raises_and_adds_no_guard(env: ShapeEnv) -> None:
    with FakeMode() as mode:
        rows = torch.nonzero(mode.to_fake(torch.randn(5)) > 0)
    n = rows.shape[0]
    assert bool(n >= 0)  # its range decides it
    with pytest.raises(DataDependentGuard) as e:
        bool(n > 2)
    assert e.value.kind == "data_dependent_branch"
    assert env.guards == []


def test_facts_kernels_assume_become_deferred_asserts(env: ShapeEnv) -> None:
    with FakeMode() as mode:
        picked = mode.to_fake(torch.randn(6))[mode.to_fake(torch.randn(6)) > 0]
        pairs = picked.view(-1, 2)
    assert pairs.shape[1] == 2
    assert any("Mod" in str(g.expr) for g in env.deferred)
    assert env.guards == []


def test_size_oblivious_questions_assume_at_least_two(env: ShapeEnv) -> None:
    u = env.create_unbacked(int, 0, 100, size=True)
    assert env.static_value(sympy.Eq(u, 1)) is None
    assert env.size_oblivious_value(sympy.Eq(u, 1)) is False
    assert env.static_value(sympy.Eq(u, 1)) is None  # the assumption is not kept


def test_off_by_default_data_dependent_ops_refuse() -> None:
    with FakeMode() as mode, pytest.raises(DataDependentOp):
        torch.nonzero(mode.to_fake(torch.randn(3)))


def _capture(fn, args, fullgraph=False, **options: bool):  # type: ignore[no-untyped-def]
    graphs = []

    def compile_graph(gm, example_inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm.forward

    policy = dataclasses.replace(DynamicDims(), **options)
    with dynamic_dims.dynamic_dims(policy):
        result = capture(
            fn,
            args,
            {},
            compile_graph=compile_graph,
            wrap_callable=lambda f: f,
            fullgraph=fullgraph,
        )
    return result, graphs


def _masked_count(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    n = t.item()
    return x[x > 0].sum() + torch.arange(n).sum()


def test_captured_graph_reads_item_and_asserts_what_it_assumed() -> None:
    x, t = torch.randn(8), torch.tensor(3)
    _, graphs = _capture(
        _masked_count, (x, t), fullgraph=True, scalar_outputs=True, dynamic_output_shapes=True
    )
    (gm,) = graphs
    targets = [n.target for n in gm.graph.nodes]
    assert "item" in targets
    for v in (0, 5):
        torch.testing.assert_close(gm(x, torch.tensor(v))[0], _masked_count(x, torch.tensor(v)))


def test_options_off_item_breaks() -> None:
    with pytest.raises(Unsupported):
        _capture(_masked_count, (torch.randn(4), torch.tensor(1)), True)
