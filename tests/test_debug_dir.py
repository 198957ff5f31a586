"""``KILN_DEBUG_DIR``: one folder per compiled frame, an index a person reads, each artifact
once, and an ``output_code.py`` that runs on its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import kiln
from kiln.capture import artifacts

ROOT = Path(__file__).resolve().parents[1]
SRC = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]


@pytest.fixture
def debug_dir(tmp_path: Path) -> Iterator[Path]:
    artifacts.set_debug_dir(tmp_path)
    kiln.reset()
    try:
        yield tmp_path
    finally:
        artifacts.set_debug_dir(None)
        kiln.reset()


def _two_layers() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _run(script: Path) -> subprocess.CompletedProcess[str]:
    path = [*SRC, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    return subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_training_step_folder_has_an_index_and_each_artifact_once(debug_dir: Path) -> None:
    model = _two_layers()
    compiled = kiln.compile(model)
    for _ in range(2):
        x = torch.randn(4, 16)
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
        out.sum().backward()
    (frame,) = [p for p in debug_dir.iterdir() if p.is_dir()]
    files = sorted(p.name for p in frame.iterdir())
    index = (frame / "index.md").read_text()
    assert "why compiled: first call" in index
    assert "graphs captured: 1" in index and "graph breaks: 0" in index
    assert "## Guards" in index and "## Timings" in index and "lower:" in index
    for name in files:  # every file is listed with what it holds
        if name not in ("index.md",) and not name.endswith(".pkl"):
            assert f"[`{name}`]" in index, name
    kernels = [f for f in files if f.endswith(".cpp")]
    assert len(kernels) == kiln.stats().kernels.get("cpp", 0) > 0
    assert not [f for f in files if f.endswith(".txt") and f.startswith("kernel")]
    assert {"graph.py", "guards.py", "aot_forward.py", "aot_backward.py"} <= set(files)
    assert {"output_code.py", "output_code_1.py"} <= set(files)
    assert len(files) < 30


def test_output_code_runs_standalone(debug_dir: Path) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.sin() + y).softmax(-1) * 2

    compiled = kiln.compile(f)
    for _ in range(2):
        x, y = torch.randn(8, 32), torch.randn(8, 32)
        torch.testing.assert_close(compiled(x, y), f(x, y))
    (script,) = debug_dir.glob("*/output_code.py")
    text = script.read_text()
    assert "((8, 32), (32, 1), torch.float32, 'cpu')" in text
    done = _run(script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ms per call" in done.stdout


def test_break_and_recompile_reasons_are_in_the_index(debug_dir: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.cos() + 1
        if y.sum() > 0:  # data-dependent branch: a graph break
            return y * 2
        return y - 2

    compiled = kiln.compile(f, dynamic=False)
    for size in (4, 4, 6):
        x = torch.randn(size)
        torch.testing.assert_close(compiled(x), f(x))
    pages = {p.parent.name: p.read_text() for p in debug_dir.glob("*/index.md")}
    text = "\n".join(pages.values())
    assert "## Graph breaks" in text and "data_dependent" in text
    assert "test_debug_dir.py" in text  # the user's line of the break
    assert "recompile:" in text


def test_plain_kiln_logs_fit_on_a_screen(capfd: pytest.CaptureFixture[str]) -> None:
    """``KILN_LOGS=kiln`` prints a line per event; whole programs print under ``+kiln``."""
    from kiln import logs

    counts = {}
    try:
        for spec in ("kiln", "+kiln"):
            kiln.reset()
            logs.set_logs(spec)
            capfd.readouterr()
            model = _two_layers()
            x = torch.randn(4, 16)
            out = kiln.compile(model)(x)
            torch.testing.assert_close(out, model(x))
            out.sum().backward()
            counts[spec] = capfd.readouterr().err
    finally:
        logs.set_logs(None)
        kiln.reset()
    assert len(counts["kiln"].splitlines()) <= 40, counts["kiln"]
    assert "def call(args)" not in counts["kiln"]
    assert "def call(args)" in counts["+kiln"]
