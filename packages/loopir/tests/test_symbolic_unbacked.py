"""Values computed from data (unbacked symbols) through loopir alone: capture's graph with
``scalar_outputs`` / ``dynamic_output_shapes`` compiled by ``compile_fx``, each symbol bound
by the wrapper after the extern call that makes it, later sizes and kernels reading it, and
the runtime asserts checked per call."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from loopir_testing import suite_backend

from kiln.capture import capture, dynamic_dims
from kiln.capture.dynamic_dims import DynamicDims
from kiln.loopir import CompiledGraph, StaticShapesOnly, compile_fx, entry


@pytest.fixture
def wrappers() -> Iterator[list[CompiledGraph]]:
    """The ATen graphs compiled while the test runs (forward first)."""
    found: list[CompiledGraph] = []

    def keep(stage: Any, aten_gm: Any, inputs: Any, backend: Any) -> Any:
        compiled = stage(aten_gm, inputs)
        found.append(compiled)
        return compiled

    entry.set_aten_stage_hook(keep)
    try:
        yield found
    finally:
        entry.set_aten_stage_hook(None)


def _compiled(fn: Callable[..., Any], args: tuple[Any, ...]) -> Callable[..., Any]:
    """``fn`` captured as one graph with data-dependent values kept, compiled by loopir."""
    programs: list[Callable[..., Any]] = []

    def compile_graph(gm: Any, example_inputs: Any) -> Any:
        programs.append(compile_fx(gm, example_inputs, backend=suite_backend()))
        return programs[-1]

    policy = dataclasses.replace(DynamicDims(), scalar_outputs=True, dynamic_output_shapes=True)
    with dynamic_dims.dynamic_dims(policy):
        capture(
            fn, args, {}, compile_graph=compile_graph, wrap_callable=lambda f: f, fullgraph=True
        )
    (program,) = programs
    return program


def _same(got: Any, want: Any) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def _item_sizes(x: torch.Tensor, t: torch.Tensor) -> Any:
    n = t.item()
    return torch.arange(n) * 2, x.reshape(-1)[:n] + 1, torch.full((n * 2 + 1,), 3.0)


def test_symbolic_item_size_is_bound_after_its_extern_call(wrappers: list[Any]) -> None:
    x = torch.randn(3, 4)
    program = _compiled(_item_sizes, (x, torch.tensor(5)))
    for v in (5, 0, 11, 2, 12):
        t = torch.tensor(v)
        _same(program(x, t), _item_sizes(x, t))
    source = wrappers[0].source
    lines = source.splitlines()
    bind = next(i for i, line in enumerate(lines) if re.match(r"\s+u\d+ = buf\d+$", line))
    read = next(i for i, line in enumerate(lines) if "_local_scalar_dense" in line)
    first_alloc = next(i for i, line in enumerate(lines) if "empty_strided" in line)
    assert read < bind < first_alloc  # torch.full's kernel reads no data, yet waits for u
    assert "min(12, u" in source  # x.reshape(-1)[:n]: the data decides which end is nearer
    assert wrappers[0].kernel_count >= 3


def _mask_rows(x: torch.Tensor, mask: torch.Tensor) -> Any:
    picked = x[mask]
    rows = torch.nonzero(mask)
    return picked * 2 + 1, rows + 0, picked.sum(0, keepdim=True) / 3


def test_dynamic_row_counts_of_extern_results_size_later_kernels(wrappers: list[Any]) -> None:
    g = torch.Generator().manual_seed(0)
    calls = [
        (torch.randn(7, 3, generator=g), torch.rand(7, generator=g) < f)
        for f in (0.5, 0.0, 1.0, 0.2)
    ]
    program = _compiled(_mask_rows, calls[0])
    for args in calls:
        _same(program(*args), _mask_rows(*args))
    source = wrappers[0].source
    # nonzero's planned strides (1, u) name its own count: bound before the layout check
    assert re.search(r"(buf\d+) = .*\n\s+(u\d+) = \1\.shape\[0\]\n\s+\1 = as_layout\(\1, ", source)
    assert re.search(r"empty_strided\(\(u\d+, 1\)", source)  # rows + 0: the count, no number


def _pairs(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask].view(-1, 2).sum(1)


def test_symbolic_runtime_asserts_raise_as_eager(wrappers: list[Any]) -> None:
    x = torch.randn(6)
    even = torch.tensor([True, True, False, True, True, False])
    program = _compiled(_pairs, (x, even))
    _same(program(x, even), (_pairs(x, even),))
    assert "raise RuntimeError" in wrappers[0].source
    odd = torch.tensor([True, True, True, False, False, False])
    with pytest.raises(RuntimeError):
        program(x, odd)


def _uniques(x: torch.Tensor) -> Any:
    values, counts = torch.unique(x, return_counts=True)
    return values * 10 + counts, torch.repeat_interleave(counts)


def test_dynamic_sizes_of_multi_output_extern_parts() -> None:
    g = torch.Generator().manual_seed(1)
    calls = [torch.randint(0, hi, (9,), generator=g) for hi in (2, 5, 1, 4)]
    program = _compiled(_uniques, (calls[0],))
    for x in calls:
        _same(program(x), _uniques(x))


def _padded(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (F.pad(x[mask], (1, 1)) * 2,)


def test_pad_of_an_unbacked_size() -> None:
    x = torch.randn(8)
    masks = [torch.tensor([True] * 6 + [False] * 2), torch.tensor([False, True] * 4)]
    program = _compiled(_padded, (x, masks[0]))
    for mask in masks:
        _same(program(x, mask), _padded(x, mask))


def _every_other_zeroed(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor]:
    y = x[mask] * 2
    y[::2] = 0  # slice_scatter with a step lowers static sizes only
    return (y,)


def test_static_shapes_only_construct_over_an_unbacked_size_raises_before_running() -> None:
    x, mask = torch.randn(8), torch.tensor([True] * 6 + [False] * 2)
    with pytest.raises(StaticShapesOnly):
        _compiled(_every_other_zeroed, (x, mask))


def _scaled(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    scale = float(s)
    return x * (scale * 2 + 1)


def test_symbolic_float_computed_from_an_item_waits_for_it(wrappers: list[Any]) -> None:
    x = torch.randn(5)
    program = _compiled(_scaled, (x, torch.tensor(0.5)))
    for v in (0.5, -3.0, 7.25):
        _same(program(x, torch.tensor(v)), (_scaled(x, torch.tensor(v)),))
    lines = wrappers[0].source.splitlines()
    read = next(i for i, line in enumerate(lines) if re.match(r"\s+u\d+ = buf\d+$", line))
    computed = next(i for i, line in enumerate(lines) if re.search(r"= \(u\d+ \* 2", line))
    assert read < computed


def _cat_picked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[mask], x[~mask] * 2, x[:2]])


def test_symbolic_cat_of_pieces_the_data_may_empty() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, generator=g)
    masks = [torch.rand(7, generator=g) < f for f in (0.5, 0.0, 1.0)]
    program = _compiled(_cat_picked, (x, masks[0]))
    for mask in masks:
        _same(program(x, mask), (_cat_picked(x, mask),))
