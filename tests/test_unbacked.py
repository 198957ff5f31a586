"""Data-dependent values as unbacked symbols: ``item()``, ``nonzero``, ``unique``, boolean
masks under ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops``.

Each program compiles to one graph without a break, equals eager over calls whose
data-dependent counts differ (zero included), on every backend; with the options off it
breaks as before; a fact a kernel assumed of a data-dependent size is checked at run time.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kiln
from kiln.capture import counters

ON = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}
BACKENDS = ["eager", "aot_eager", "kiln"]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no backend failure falling back to eager
        yield
    kiln.reset()


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _check(fn: Callable[..., Any], calls: list[tuple[Any, ...]], backend: str) -> None:
    compiled = kiln.compile(fn, backend=backend, options=ON)
    for args in calls:
        _same(compiled(*args), fn(*args))
    snap = counters.snapshot()
    assert snap.get("graph_breaks", {}) == {}, snap
    assert snap["stats"]["graphs_compiled"] == 1, snap
    assert snap["stats"].get("eager_fallbacks", 0) == 0, snap


def _masks(shape: tuple[int, ...], fractions: tuple[float, ...] = (0.5, 0.0, 0.9, 0.2)) -> list:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(shape, generator=g) < f for f in fractions]


def item_ops(x: torch.Tensor, t: torch.Tensor) -> Any:
    n = t.item()
    m = n * 2 + 1
    return torch.arange(n) * 2, x.reshape(-1)[:n] + 1, torch.full((m,), 3.0), x[: n % 3].sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_item_feeds_tensor_ops(backend: str) -> None:
    calls = [(torch.randn(3, 4), torch.tensor(v)) for v in (5, 0, 11, 2)]
    _check(item_ops, calls, backend)


def int_float(x: torch.Tensor, t: torch.Tensor, s: torch.Tensor) -> Any:
    n = int(t)
    scale = float(s)
    return x[:n] * scale, x.sum() * scale, torch.full((2,), t.tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_int_float_tolist(backend: str) -> None:
    calls = [(torch.randn(6, 2), torch.tensor(v), torch.rand(())) for v in (3, 0, 6)]
    _check(int_float, calls, backend)


def mask_reads(x: torch.Tensor, mask: torch.Tensor) -> Any:
    picked = x[mask]
    rows = torch.nonzero(mask)
    selected = torch.masked_select(x, mask)
    return picked * 2 + 1, rows, selected.sum(), picked.numel() + 0 * x.sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_reads_nonzero_masked_select(backend: str) -> None:
    calls = [(torch.randn(5, 4), m) for m in _masks((5, 4))]
    _check(mask_reads, calls, backend)


def mask_write(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[mask] = -1.0
    y[~mask] = y[~mask] * 2
    return y


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_write(backend: str) -> None:
    calls = [(torch.randn(4, 3), m) for m in _masks((4, 3))]
    _check(mask_write, calls, backend)


def uniques(x: torch.Tensor) -> Any:
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    return values + 1, inverse, counts, torch.unique_consecutive(x), torch.repeat_interleave(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unique_and_repeat_interleave(backend: str) -> None:
    g = torch.Generator().manual_seed(1)
    calls = [(torch.randint(0, hi, (9,), generator=g),) for hi in (2, 5, 1, 4)]
    _check(uniques, calls, backend)


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, window: torch.Tensor) -> Any:
    # the window comes from data; keys outside it are masked, and the positions kept are
    # gathered with nonzero as a sparse attention would
    w = window.item()
    n = q.shape[0]
    pos = torch.arange(n)
    allowed = (pos[:, None] - pos[None, :]).abs() <= w
    scores = (q @ k.t()).masked_fill(~allowed, float("-inf"))
    rows, cols = torch.nonzero(allowed, as_tuple=True)
    return scores.softmax(-1), rows, cols, scores[allowed]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_attention_mask(backend: str) -> None:
    calls = [(torch.randn(6, 4), torch.randn(6, 4), torch.tensor(w)) for w in (1, 0, 3)]
    _check(sliding_window_attention, calls, backend)


def masked_loss(x: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((x * w)[mask] ** 2).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_through_masked_select(backend: str) -> None:
    compiled = kiln.compile(masked_loss, backend=backend, options=ON)
    for mask in _masks((4, 5)):
        x = torch.randn(4, 5)
        w = torch.randn(4, 5, requires_grad=True)
        w_ref = w.detach().clone().requires_grad_(True)
        out = compiled(x, w, mask)
        ref = masked_loss(x, w_ref, mask)
        out.backward()
        ref.backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(w.grad, w_ref.grad)
    assert counters.snapshot().get("graph_breaks", {}) == {}


@pytest.mark.parametrize("fn", [item_ops, mask_reads, uniques])
def test_options_off_still_break(fn: Callable[..., Any]) -> None:
    args = {item_ops: (torch.randn(3, 4), torch.tensor(2)), uniques: (torch.tensor([1, 1, 2]),)}
    call = args.get(fn, (torch.randn(5, 4), _masks((5, 4))[0]))
    compiled = kiln.compile(fn, backend="eager")
    _same(compiled(*call), fn(*call))
    assert counters.snapshot().get("graph_breaks"), "expected a graph break"


def branch(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    n = t.item()
    if n > 2:  # undecidable without data: a clean break, never a guess
        return x * 2
    return x - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_branch_on_unbacked_breaks(backend: str) -> None:
    compiled = kiln.compile(branch, backend=backend, options=ON)
    for v in (5, 0, 3, 1):
        x = torch.randn(3)
        _same(compiled(x, torch.tensor(v)), branch(x, torch.tensor(v)))
    snap = counters.snapshot()
    # the graph breaks at the branch and returns n, which the generated frame tests; the
    # branch's continuations take it as a symbolic input: 3 graphs, no recompile
    assert snap["graph_breaks"] == {"data_dependent_branch": 1}, snap
    assert snap["stats"]["graphs_compiled"] == 3, snap
    assert snap["stats"].get("eager_fallbacks", 0) == 0, snap
    assert kiln.stats().recompiles == 0, snap


def pairs(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask].view(-1, 2).sum(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_runtime_assert_raises_as_eager(backend: str) -> None:
    compiled = kiln.compile(pairs, backend=backend, options=ON)
    x = torch.randn(6)
    even = torch.tensor([True, True, False, True, True, False])
    _same(compiled(x, even), pairs(x, even))
    odd = torch.tensor([True, True, True, False, False, False])
    with pytest.raises(RuntimeError):
        pairs(x, odd)
    with pytest.raises(RuntimeError):
        compiled(x, odd)


def checked_prefix(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    n = t.item()
    torch._check(n <= x.shape[0])  # a fact the program states: a runtime assert, no break
    return x[:n] * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_check_is_a_runtime_assert(backend: str) -> None:
    _check(checked_prefix, [(torch.randn(6), torch.tensor(v)) for v in (3, 0, 6)], backend)
    compiled = kiln.compile(checked_prefix, backend=backend, options=ON)
    with pytest.raises(RuntimeError):
        compiled(torch.randn(6), torch.tensor(7))


# -- the default backend compiles them: loopir kernels, the data-dependent op an extern call --

_KERNEL_CALLS: dict[str, tuple[Callable[..., Any], Callable[[], list[tuple[Any, ...]]]]] = {
    "item_ops": (item_ops, lambda: [(torch.randn(3, 4), torch.tensor(v)) for v in (5, 0, 11, 2)]),
    "int_float": (
        int_float,
        lambda: [(torch.randn(6, 2), torch.tensor(v), torch.rand(())) for v in (3, 0, 6)],
    ),
    "mask_reads": (mask_reads, lambda: [(torch.randn(5, 4), m) for m in _masks((5, 4))]),
    "mask_write": (mask_write, lambda: [(torch.randn(4, 3), m) for m in _masks((4, 3))]),
    "uniques": (
        uniques,
        lambda: [(torch.randint(0, hi, (9,)),) for hi in (2, 5, 1, 4)],
    ),
    "sliding_window_attention": (
        sliding_window_attention,
        lambda: [(torch.randn(6, 4), torch.randn(6, 4), torch.tensor(w)) for w in (1, 0, 3)],
    ),
    "pairs": (
        pairs,
        lambda: [
            (torch.randn(6), m) for m in _masks((6,), (0.5, 0.0, 1.0)) if int(m.sum()) % 2 == 0
        ],
    ),
    "checked_prefix": (
        checked_prefix,
        lambda: [(torch.randn(6), torch.tensor(v)) for v in (3, 0, 6)],
    ),
}


def _compiled_with_kernels() -> None:
    stats = kiln.stats()
    assert stats.kernels.get("cpp", 0) > 0, stats
    assert stats.recompiles == 0, stats
    snap = counters.snapshot()["stats"]
    assert not snap.get("data_dependent_graphs"), snap  # not aot_eager's ATen kernels


@pytest.mark.parametrize("name", sorted(_KERNEL_CALLS))
def test_default_backend_compiles_cpp_kernels(name: str) -> None:
    fn, calls = _KERNEL_CALLS[name]
    _check(fn, calls(), "kiln")
    _compiled_with_kernels()


def test_default_backend_trains_through_masked_select_with_kernels() -> None:
    test_training_through_masked_select("kiln")
    _compiled_with_kernels()


def test_unbacked_size_is_a_kernel_argument_not_a_literal(tmp_path: Path) -> None:
    def picked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (x[mask] * 2 + 1).relu()

    compiled = kiln.compile(picked, options={**ON, "debug_dir": str(tmp_path)})
    x = torch.randn(41, 3)
    for count in (23, 0, 41, 7):
        mask = torch.zeros(41, dtype=torch.bool)
        mask[torch.randperm(41)[:count]] = True
        _same(compiled(x, mask), picked(x, mask))
    _compiled_with_kernels()
    kernels = "\n".join(p.read_text() for p in tmp_path.rglob("*.cpp"))
    (wrapper,) = tmp_path.rglob("output_code.py")
    assert re.search(r"int64_t u\d+", kernels), kernels  # the count is the kernel's argument
    assert not re.search(r"\b(23|8192)\b", kernels), kernels  # no count, no hint baked in
    assert re.search(r"u\d+ = buf\d+\.shape\[0\]", wrapper.read_text())


def test_runtime_asserts_are_checked_by_the_generated_wrapper(tmp_path: Path) -> None:
    compiled = kiln.compile(pairs, options={**ON, "debug_dir": str(tmp_path)})
    x = torch.randn(6)
    even = torch.tensor([True, True, False, True, True, False])
    _same(compiled(x, even), pairs(x, even))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        compiled(x, torch.tensor([True, True, True, False, False, False]))
    _compiled_with_kernels()
    (wrapper,) = tmp_path.rglob("output_code.py")
    assert "raise RuntimeError" in wrapper.read_text()


def every_other_zeroed(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    y = x[mask] * 2
    y[::2] = 0  # loopir lowers a stepped slice_scatter over static sizes only
    return y


def test_what_loopir_cannot_compile_runs_with_aten_kernels_not_eagerly() -> None:
    _check(every_other_zeroed, [(torch.randn(8), m) for m in _masks((8,))], "kiln")
    assert counters.snapshot()["stats"].get("data_dependent_graphs") == 1
