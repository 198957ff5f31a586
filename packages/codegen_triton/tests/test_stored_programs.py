"""Programs of the Triton backend stored as bytes (``loopir.save_fx``) and loaded again, as the
whole-graph cache does across processes: the loaded program writes its kernel modules again
under the loading process's cache folder, keeps the configs it tuned, and equals eager."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from kiln.capture.meta import FakeTensor
from kiln.capture.shapes import ShapeEnv, symbolic_meta
from kiln.capture.source import LocalSource
from kiln.codegen_triton import TritonBackend, TritonOptions, config, runtime
from kiln.codegen_triton.runtime import TritonLauncher
from kiln.codegen_triton.symbolic_launch import SymbolicLauncher
from kiln.loopir import compile_fx, load_fx, save_fx


def _graph(
    fn: Callable[..., object], examples: Sequence[torch.Tensor], dims: Sequence[Sequence[int]]
) -> fx.GraphModule:
    """``fn`` traced as capture gives it: placeholders with fakes, ``dims[i]`` symbolic."""
    gm = fx.symbolic_trace(fn)
    env = ShapeEnv()
    for node, t, d in zip(gm.graph.find_nodes(op="placeholder"), examples, dims, strict=True):
        meta = symbolic_meta(t, LocalSource(node.name), env, dynamic_dims=d)
        node.meta["val"] = FakeTensor(meta, t.device, requires_grad=False)
    return gm


def _program(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    normed = torch.nn.functional.layer_norm(x, (24,), w)
    return (torch.softmax(x * 2.0, -1) + normed, x.sum(0), torch.sigmoid(x).t().contiguous())


def _use_cache_folder(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    monkeypatch.setattr(config, "options", dataclasses.replace(config.options, cache_dir=folder))


@pytest.mark.parametrize("dims", [[(), ()], [(0,), ()]], ids=["static", "symbolic"])
def test_a_stored_program_loads_into_an_empty_cache_folder_and_equals_eager(
    dims: list[tuple[int, ...]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = TritonBackend(TritonOptions(parallel_compile=False, cache_dir=tmp_path / "a"))
    _use_cache_folder(monkeypatch, tmp_path / "a")
    examples = [torch.randn(13, 24), torch.randn(24)]
    compiled = compile_fx(_graph(_program, examples, dims), examples, backend=backend)
    torch.testing.assert_close(compiled(*examples), _program(*examples), atol=1e-5, rtol=1e-5)
    data = save_fx(compiled)

    # as in another process: its own cache folder, empty
    _use_cache_folder(monkeypatch, tmp_path / "b")
    restored: list[TritonLauncher] = []

    def restore(*args: Any) -> TritonLauncher:
        restored.append(made := runtime_restored(*args))
        return made

    runtime_restored = runtime._restored
    monkeypatch.setattr(runtime, "_restored", restore)
    loaded = load_fx(data, _graph(_program, examples, dims), examples, backend=backend)
    for n in [13] if not dims[0] else [13, 5, 40]:
        inputs = [torch.randn(n, 24), torch.randn(24)]
        torch.testing.assert_close(loaded(*inputs), _program(*inputs), atol=1e-5, rtol=1e-5)

    kind = SymbolicLauncher if dims[0] else TritonLauncher
    assert restored and all(type(launcher) is kind for launcher in restored)
    assert all(launcher.path.is_relative_to(tmp_path / "b") for launcher in restored)
    assert all(launcher.path.read_text() == launcher.ks.module_text for launcher in restored)
    if kind is TritonLauncher:  # the configs the first process picked, not picked again
        assert all(launcher.tuner.best is not None for launcher in restored)
