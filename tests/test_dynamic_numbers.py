"""Python numbers as symbolic graph inputs under the default backend.

A float that changes between calls (a scale argument, or a float computed by ``.item()`` and
handed across a graph break) becomes a ``SymFloat`` input of the graph; loopir binds it once
per call and passes it to the kernels that use it as a ``double`` argument, so one compile
serves every value (it had compiled per value up to the recompile limit, then run eagerly).
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

_OPTIONS: dict[str, dict[str, Any]] = {"default": {}, "dynamic_kernels": {"dynamic_kernels": True}}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    kiln.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback, no recompile-limit warning
        yield
    kiln.reset()


def _values(n: int = 12) -> list[float]:
    return [0.25 + 0.37 * i + 1e-7 * i for i in range(n)]


def _assert_compiled_once_for_the_numbers() -> None:
    stats = counters.snapshot()["stats"]
    # the first call specializes the float; once it changes, it is captured as a symbol
    assert stats["frames_captured"] <= 2
    assert stats["graphs_compiled"] <= 2
    assert not stats.get("size_specializations")
    assert not stats.get("static_shape_fallbacks")
    assert not stats.get("eager_fallbacks")


def _run(
    fn: Callable[..., torch.Tensor],
    make: Callable[[], torch.Tensor],
    options: dict[str, Any],
    values: list[Any] | None = None,
    *,
    exact: bool = False,
) -> None:
    compiled = kiln.compile(fn, options=options)
    tol = {"rtol": 0.0, "atol": 0.0} if exact else {}
    for s in values or _values():
        x = make()
        torch.testing.assert_close(compiled(x, s), fn(x, s), **tol)  # type: ignore[arg-type]
    _assert_compiled_once_for_the_numbers()


def _scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s + 1


@pytest.mark.parametrize("options", sorted(_OPTIONS))
def test_a_float_argument_compiles_once(options: str) -> None:
    _run(_scale, lambda: torch.randn(8, 5), _OPTIONS[options])


@pytest.mark.parametrize("options", sorted(_OPTIONS))
def test_a_float_from_item_across_a_break_compiles_once(options: str) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        s = x.sum().item()  # graph break; the continuation takes the float
        return x * s + 1

    compiled = kiln.compile(f, options=_OPTIONS[options])
    for _ in range(12):
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), f(x))
    stats = counters.snapshot()["stats"]
    assert stats["frames_captured"] <= 3  # the first frame, the continuation twice
    assert not stats.get("size_specializations")
    assert not stats.get("eager_fallbacks")


def test_the_kernel_takes_the_float_as_an_argument(tmp_path: Path) -> None:
    compiled = kiln.compile(_scale, options={"debug_dir": str(tmp_path)})
    values = [1.2345678, 2.3456789, 3.4567891, 4.5678912]
    for s in values:
        x = torch.randn(8, 5)
        torch.testing.assert_close(compiled(x, s), _scale(x, s))
    files = [*tmp_path.rglob("*.cpp")]
    assert files, "no generated source was dumped"
    text = "\n".join(p.read_text() for p in files)
    assert re.search(r"double s\d+", text), "the kernel takes no double argument"
    for s in values[1:]:  # the first call's graph is static: its float is a literal
        assert str(s)[:6] not in text, "a number was baked into the generated code"
    _assert_compiled_once_for_the_numbers()


@pytest.mark.parametrize("options", sorted(_OPTIONS))
def test_an_int_tensor_times_a_float(options: str) -> None:
    _run(_scale, lambda: torch.randint(-50, 50, (6, 7)), _OPTIONS[options], exact=True)


def test_a_float64_tensor_times_a_float_is_exact() -> None:
    def f(x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    values = [0.1 + 1e-13 * i for i in range(12)]  # apart only in double precision
    _run(f, lambda: torch.randn(9, dtype=torch.float64), {}, values, exact=True)


def test_a_bfloat16_tensor_times_a_float() -> None:
    def f(x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    _run(f, lambda: torch.randn(33, dtype=torch.bfloat16), {}, exact=True)


def test_pow_with_a_float_exponent() -> None:
    def f(x: torch.Tensor, p: float) -> torch.Tensor:
        return x.abs() ** p

    _run(f, lambda: torch.randn(17), {}, [0.5 + 0.3 * i for i in range(12)])


def test_clamp_with_number_bounds() -> None:
    def f(x: torch.Tensor, lo: float) -> torch.Tensor:
        return x.clamp(lo, 0.75) + x.clamp(max=lo) + torch.full_like(x, lo)

    _run(f, lambda: torch.randn(40), {}, [-1.0 + 0.13 * i for i in range(12)], exact=True)


def test_floats_computed_from_a_float() -> None:
    """Floats the graph computes from a float input (``lo + 0.5``) are computed by the wrapper
    as eager's Python computes them, and reach kernels as arguments too."""

    def f(x: torch.Tensor, lo: float) -> torch.Tensor:
        return x.clamp(lo, lo + 0.5) * (-lo / 3.0) + torch.full_like(x, 2 * lo - 1)

    _run(f, lambda: torch.randn(40, dtype=torch.float64), {})  # a fused multiply-add


@pytest.mark.parametrize("options", sorted(_OPTIONS))
def test_activations_with_a_float(options: str) -> None:
    def f(x: torch.Tensor, s: float) -> torch.Tensor:
        y = torch.nn.functional.leaky_relu(x, s) + torch.addcmul(x, x, x, value=s)
        return torch.nn.functional.hardtanh(y, -s, s) - torch.rsub(x, 1.0, alpha=s)

    _run(f, lambda: torch.randn(30), _OPTIONS[options])


def test_an_unsupported_use_is_compiled_per_value() -> None:
    """A float an op takes where loopir has no symbolic form (elu's alpha) compiles the
    graph per value: correct, but past the limit with eager kernels."""

    def f(x: torch.Tensor, p: float) -> torch.Tensor:
        return torch.nn.functional.elu(x, p)

    compiled = kiln.compile(f)
    with pytest.warns(RuntimeWarning, match="recompile limit"):
        for p in [1.0 + 0.25 * i for i in range(12)]:
            x = torch.randn(5)
            torch.testing.assert_close(compiled(x, p), f(x, p))
    assert counters.snapshot()["stats"]["static_shape_fallbacks"] == 1


def test_an_int_number() -> None:
    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n - n

    _run(f, lambda: torch.randn(10), {"dynamic_kernels": True}, list(range(3, 15)), exact=True)


@pytest.mark.parametrize("options", sorted(_OPTIONS))
def test_a_float_in_training(options: str) -> None:
    def f(x: torch.Tensor, s: float) -> torch.Tensor:
        return (x * s).sin().sum()

    compiled = kiln.compile(f, options=_OPTIONS[options])
    for s in _values():
        x = torch.randn(6, 3, requires_grad=True)
        compiled(x, s).backward()
        x2 = x.detach().clone().requires_grad_()
        f(x2, s).backward()
        torch.testing.assert_close(x.grad, x2.grad)
    _assert_compiled_once_for_the_numbers()
