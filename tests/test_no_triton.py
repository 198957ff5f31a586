"""Kiln without Triton: ``import kiln`` and CPU compilation in an interpreter that cannot import
``triton`` (``tests/no_triton/sitecustomize.py``), with ``kiln.codegen_triton`` installed and
without it; a CUDA device's backend falls back to loopir's reference one with a warning naming
what is missing. ``nox -s no-triton`` runs this and the frontend's tests in a venv without
``kiln.codegen_triton``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

SCRIPT = r"""
import logging, sys
import torch
import kiln
from kiln import loopir

assert "triton" not in sys.modules
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("kiln").addHandler(handler)

def block(x, w):
    return torch.softmax(x @ w, dim=-1).sin() * 2

for mode in (None, "reduce-overhead"):
    kiln.reset()
    f = kiln.compile(block, mode=mode)
    for _ in range(3):
        x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16)
        out, want = f(x, w), block(x, w)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(*(torch.autograd.grad(o.sum(), x)[0] for o in (out, want)))
    stats = kiln.stats()
    assert set(stats.kernels) == {"cpp"} and stats.eager_fallbacks == 0, stats

assert [c.name for c in kiln.cache.info() if c.name not in ("graphs", "guards", "probes")] == ["cpp"]
# a CUDA graph's kernels: loopir's reference backend, with a warning naming the missing module
assert isinstance(loopir.get_backend("cuda"), loopir.ReferenceBackend)
messages = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
missing = [m for m in messages if "No module named" in m]
assert any("'cudagraphs'" in m for m in missing), messages
assert any("no code generator for device 'cuda'" in m for m in missing), messages
assert "triton" not in sys.modules
print("MISSING", *missing, sep="\n")
"""


@pytest.mark.parametrize(
    "hide", ["", "kiln.codegen_triton"], ids=["triton-absent", "codegen-triton-absent"]
)
def test_import_and_cpu_compile_without_triton(hide: str) -> None:
    path = [str(HERE / "no_triton"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env["KILN_HIDE_MODULES"] = hide
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    missing = done.stdout.split("MISSING\n", 1)[1]
    installed = importlib.util.find_spec("kiln.codegen_triton") is not None
    absent = hide or ("triton" if installed else "kiln.codegen_triton")
    assert f"No module named '{absent}'" in missing
