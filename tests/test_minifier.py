"""The minifier: planted wrong results and crashes shrink to tiny graphs whose scripts fail.

Each test plants a bug in a module of its own (a backend that perturbs ``sin``, or a loopir
lowering of ``sin`` that computes ``cos``), compiles a small program with ``KILN_REPRO`` set,
and runs the written ``repro.py`` in a fresh process, where the module is imported again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import kiln
from kiln.loopir.entry import set_aten_stage_hook
from kiln.loopir.lowering.registry import LOWERINGS

ROOT = Path(__file__).resolve().parents[1]
SRC = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]

PLANTED = textwrap.dedent(
    """
    import torch
    from kiln import loopir
    from kiln.loopir.lowering.registry import LOWERINGS

    aten = torch.ops.aten
    SIN = (torch.sin, "sin", aten.sin.default)


    def _sins(gm):
        return [n for n in gm.graph.nodes if n.op != "placeholder" and n.target in SIN]


    def perturb_sin(gm, example_inputs):
        for node in _sins(gm):
            node.target = "cos" if node.op == "call_method" else torch.cos
        gm.recompile()
        return gm.forward


    def crash_on_sin(gm, example_inputs):
        if _sins(gm):
            raise RuntimeError("planted crash on sin")
        return gm.forward


    def _crash(*args, **kwargs):
        raise NotImplementedError("planted lowering crash")


    if "{lowering}" == "wrong":
        LOWERINGS[aten.sin.default] = LOWERINGS[aten.cos.default]
    elif "{lowering}" == "crash":
        LOWERINGS[aten.sin.default] = _crash


    def reference(gm, example_inputs):
        return loopir.compile_fx(gm, example_inputs, backend=loopir.ReferenceBackend())
    """
)


def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = x * 2 + y
    b = a.relu()
    c = torch.sin(b) * y
    d = c.sum(-1, keepdim=True) + a
    return (d.tanh() * 3).exp()


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder for the planted module, on sys.path; the lowering table restored after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sin = torch.ops.aten.sin.default
    monkeypatch.setitem(LOWERINGS, sin, LOWERINGS[sin])
    yield tmp_path
    sys.modules.pop("planted_bug", None)
    set_aten_stage_hook(None)
    kiln.reset()


def _plant(folder: Path, lowering: str = "") -> object:
    (folder / "planted_bug.py").write_text(PLANTED.replace("{lowering}", lowering))
    sys.modules.pop("planted_bug", None)
    import planted_bug  # type: ignore[import-not-found]

    return planted_bug


def _run_repro(folder: Path) -> subprocess.CompletedProcess[str]:
    path = [str(folder), *SRC, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop("KILN_REPRO", None)
    return subprocess.run(
        [sys.executable, "repro.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _compute_nodes(folder: Path) -> int:
    body = (folder / "repro.py").read_text().split("def forward", 1)[1].split("INPUTS", 1)[0]
    return sum(" = " in line for line in body.splitlines())


def _check(folder: Path, expect: str) -> None:
    assert (folder / "repro.py").exists()
    # placeholder(s), the one failing op, the output: at most three nodes
    assert _compute_nodes(folder) == 1, (folder / "repro.py").read_text()
    done = _run_repro(folder)
    assert done.returncode == 1, done.stdout + done.stderr
    assert expect in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("stage", ["after_capture", "after_aot"])
def test_wrong_result_is_minified(
    planted: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    bug = _plant(planted, "wrong" if stage == "after_aot" else "")
    monkeypatch.setenv("KILN_REPRO", stage)
    monkeypatch.setenv("KILN_REPRO_LEVEL", "accuracy")
    backend = bug.reference if stage == "after_aot" else bug.perturb_sin  # type: ignore[attr-defined]
    compiled = kiln.compile(program, backend=backend)
    for _ in range(2):
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        out = compiled(x, y)
        assert not torch.allclose(out, program(x, y))  # the planted bug stays in the program
    _check(planted, f"fails at {stage} (accuracy)")
    assert "sin" in (planted / "repro.py").read_text()


@pytest.mark.parametrize("stage", ["after_capture", "after_aot"])
def test_crash_is_minified(planted: Path, monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    bug = _plant(planted, "crash" if stage == "after_aot" else "")
    monkeypatch.setenv("KILN_REPRO", stage)
    backend = bug.reference if stage == "after_aot" else bug.crash_on_sin  # type: ignore[attr-defined]
    compiled = kiln.compile(program, backend=backend)
    with pytest.warns(RuntimeWarning, match="planted"):
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        torch.testing.assert_close(compiled(x, y), program(x, y))  # the graph ran eagerly
    error = "NotImplementedError" if stage == "after_aot" else "RuntimeError"
    _check(planted, f"fails at {stage} (exception): {error}")


def test_fixed_bug_passes(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script exits 0 once the bug is gone (here: the planted module no longer plants)."""
    bug = _plant(planted)
    monkeypatch.setenv("KILN_REPRO", "after_capture")
    monkeypatch.setenv("KILN_REPRO_LEVEL", "accuracy")
    kiln.compile(program, backend=bug.perturb_sin)(torch.randn(4, 8), torch.randn(4, 8))  # type: ignore[attr-defined]
    text = (planted / "planted_bug.py").read_text().replace('"cos" if', '"sin" if')
    (planted / "planted_bug.py").write_text(text.replace("torch.cos\n", "torch.sin\n"))
    done = _run_repro(planted)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passes" in done.stdout


def test_bad_setting_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_REPRO", "after_everything")
    with pytest.warns(RuntimeWarning, match="KILN_REPRO must be one of after_capture, after_aot"):
        kiln.compile(program)(torch.randn(2, 2), torch.randn(2, 2))


def test_repro_goes_to_the_frame_folder(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a debug folder, the script lands in the failing frame's folder and its index."""
    bug = _plant(planted)
    monkeypatch.setenv("KILN_REPRO", "after_capture")
    debug = planted / "debug"
    compiled = kiln.compile(
        program,
        backend=bug.crash_on_sin,  # type: ignore[attr-defined]
        options={"debug_dir": str(debug)},
    )
    with pytest.warns(RuntimeWarning, match="planted"):
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        torch.testing.assert_close(compiled(x, y), program(x, y))
    assert not (planted / "repro.py").exists()
    (script,) = debug.glob("*/repro.py")
    assert "[`repro.py`]" in (script.parent / "index.md").read_text()
    assert _compute_nodes(script.parent) == 1
