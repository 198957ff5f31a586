"""Persistence: compiled modules and functions pickle by value of their originals."""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 3)
    )


def _agree(compiled, eager, calls: int = 3) -> None:
    for n in range(2, 2 + calls):
        x = torch.randn(n, 6)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), eager(x))


@kiln.compile
def decorated(x):
    return torch.sin(x) * 2 + x


def plain(x):
    return torch.cos(x) - x


def _roundtrips():
    def with_torch_save(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    return {
        "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
        "torch.save": with_torch_save,
        "deepcopy": copy.deepcopy,
    }


@pytest.mark.parametrize("how", sorted(_roundtrips()))
def test_compiled_module_roundtrips_and_recompiles(how):
    model = _model()
    compiled = kiln.compile(model, options={"recompile_limit": 4})
    _agree(compiled, model)
    loaded = _roundtrips()[how](compiled)
    assert isinstance(loaded, kiln.OptimizedModule)
    assert loaded._orig_mod is not model  # by value, not a reference to this process's model
    assert loaded._kiln_call._config == compiled._kiln_call._config
    assert loaded._kiln_call._backend is compiled._kiln_call._backend
    for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    captured = kiln.stats().frames_captured
    _agree(loaded, model)
    assert kiln.stats().frames_captured > captured  # compiled again, lazily, on its first call
    assert kiln.stats().eager_fallbacks == 0


@pytest.mark.parametrize("how", sorted(_roundtrips()))
def test_compiled_functions_roundtrip(how):
    x = torch.randn(5)
    loaded = _roundtrips()[how](decorated)
    assert loaded is decorated  # the module's own name for it, as for a plain function
    torch.testing.assert_close(loaded(x), torch.sin(x) * 2 + x)
    compiled = kiln.compile(plain, backend="aot_eager")
    loaded = _roundtrips()[how](compiled)
    assert isinstance(loaded, kiln.CompiledFunction)
    assert loaded.original is plain
    torch.testing.assert_close(loaded(x), plain(x))
    assert kiln.stats().eager_fallbacks == 0


def test_user_backend_pickles_by_reference():
    compiled = kiln.compile(_model(), backend=kiln.backends.eager)
    loaded = pickle.loads(pickle.dumps(compiled))
    assert loaded._kiln_call._backend is kiln.backends.eager


def test_trained_module_loads_in_a_fresh_process(tmp_path: Path):
    model = _model()
    compiled = kiln.compile(model)
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    for _ in range(2):
        compiled(torch.randn(4, 6)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    x = torch.randn(3, 6)
    path = tmp_path / "model.pt"
    torch.save({"model": compiled, "x": x, "expected": model(x).detach()}, path)
    child = f"""
import torch, kiln
saved = torch.load({str(path)!r}, weights_only=False)
with torch.no_grad():
    torch.testing.assert_close(saved["model"](saved["x"]), saved["expected"])
assert isinstance(saved["model"], kiln.OptimizedModule)
assert kiln.stats().frames_captured == 1 and kiln.stats().eager_fallbacks == 0
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
