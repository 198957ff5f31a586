"""Compiled code dies with what it was compiled for.

A cache belongs to the function objects that use it: once a compiled module or closure and
the user's references are gone, its entries, artifacts and everything their checks bind are
collectable, and the global lookup table keeps nothing of them.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest
import torch

import kiln
from kiln import api

CYCLES = 50


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _model() -> torch.nn.Module:
    # about 8 MB of parameters: a leaked copy per cycle would show in RSS
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)
    )


def _closure() -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]:
    w = torch.randn(1024, 1024)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x @ w).relu() + 1

    return f, w


def _module_cycle(backend: str) -> list[weakref.ref[object]]:
    m = _model()
    compiled = kiln.compile(m, backend=backend)
    for n in (2, 3):
        x = torch.randn(n, 1024)
        torch.testing.assert_close(compiled(x), m(x))
    refs: list[weakref.ref[object]] = [weakref.ref(m), weakref.ref(m[0].weight)]
    refs.append(weakref.ref(compiled))
    del m, compiled
    return refs


def _closure_cycle(backend: str) -> list[weakref.ref[object]]:
    f, w = _closure()
    compiled = kiln.compile(f, backend=backend)
    for n in (2, 3):
        x = torch.randn(n, 1024)
        torch.testing.assert_close(compiled(x), f(x))
    refs: list[weakref.ref[object]] = [weakref.ref(w), weakref.ref(f), weakref.ref(compiled)]
    del f, w, compiled
    return refs


def _assert_freed(
    cycle: Callable[[str], list[weakref.ref[object]]],
    backend: str,
    n: int,
    resident_bytes: Callable[[], int],
) -> None:
    refs = cycle(backend)  # warm up: the first compile imports and caches Kiln's own state
    gc.collect()
    assert all(r() is None for r in refs)
    before = resident_bytes()
    for _ in range(n):
        refs = cycle(backend)
        gc.collect()
        alive = [r() for r in refs if r() is not None]
        assert not alive, f"still alive after del + gc.collect(): {[type(a) for a in alive]}"
        assert len(api._caches) == 0
        assert not api._skipped
    # each leaked cycle would keep 8 MB (module) or 4 MB (closure)
    assert resident_bytes() - before < 48 * 2**20


@pytest.mark.parametrize(("backend", "cycles"), [("eager", CYCLES), ("aot_eager", 10)])
def test_compiled_module_dies_with_the_module(backend, cycles, resident_bytes):
    _assert_freed(_module_cycle, backend, cycles, resident_bytes)


@pytest.mark.parametrize(("backend", "cycles"), [("eager", CYCLES), ("aot_eager", 10)])
def test_compiled_closure_dies_with_its_tensors(backend, cycles, resident_bytes):
    _assert_freed(_closure_cycle, backend, cycles, resident_bytes)


def test_kiln_backend_artifacts_die_with_the_module(resident_bytes):
    _assert_freed(_module_cycle, "kiln", 2, resident_bytes)
    _assert_freed(_closure_cycle, "kiln", 2, resident_bytes)


def test_bound_method_calls_share_one_cache():
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        @kiln.compile(backend="eager")
        def run(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).relu()

    m = M()
    x = torch.randn(2, 4)
    torch.testing.assert_close(m.run(x), m.lin(x).relu())
    m.run(x)
    (cache,) = api._caches.values()
    assert len(cache.entries) == 1  # a fresh bound wrapper per access, one cache


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1024, 1024)

    @kiln.compile(backend="eager")
    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def test_instances_die_though_their_method_s_cache_lives(resident_bytes):
    """The class's function (and so its cache) lives on: its entries must not keep the
    instances they were compiled for."""
    refs = []
    _Layer().run(torch.randn(2, 1024))  # first compile's one-time allocations are not a leak
    gc.collect()
    before = resident_bytes()
    for _ in range(CYCLES):
        layer = _Layer()
        x = torch.randn(2, 1024)
        torch.testing.assert_close(layer.run(x), layer.lin(x).relu())
        refs.append(weakref.ref(layer))
        del layer
    gc.collect()
    assert all(r() is None for r in refs)
    assert resident_bytes() - before < 48 * 2**20
    # the entries for the dead instances were dropped, not left to fail on every call
    assert all(not c.entries for c in api._caches.values())


def test_a_wrapper_with_a_copied_dict_does_not_take_the_wrapped_function_s_cache():
    import functools

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    cf = kiln.compile(f, backend="eager")
    cf(torch.randn(3))

    @functools.wraps(f)  # copies f.__dict__, the caches f owns included
    def w(x: torch.Tensor) -> torch.Tensor:
        return f(x) * 2

    cw = kiln.compile(w, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(cw(x), (x + 1) * 2)
    del cf, cw
    gc.collect()
    # f's cache is still f's own, with its entry
    assert any(c.code is f.__code__ and c.entries for c in api._caches.values())
