"""The OpInfo sweep (``python -m opinfo``): its comparison, its process isolation, and a float32
share of PyTorch's CPU OpInfos compiled with the default backend, which must all pass.

The whole float32 sweep takes longer than CI allows (``nox -s opinfo`` runs it, and bfloat16 and
gradients); here a fixed slice of it runs: every ``STRIDE``-th op by name, plus the ops that once
compiled wrong, each standing for a class of bug.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opinfo.__main__ import select  # noqa: E402
from opinfo.check import Mismatch, OpResult, compare  # noqa: E402
from opinfo.report import FAILING, summary  # noqa: E402
from opinfo.runner import SweepConfig, run_sweep  # noqa: E402

STRIDE = 8
#: Ops that compiled to a wrong answer or failed to compile, one or two per class of bug, with
#: the modes they failed in; they run on more samples than the slice (the failing one was late).
REGRESSIONS: dict[str, tuple[str, ...]] = {
    "logit": ("float32", "grad"),  # eps > 0.5: ATen's bounds cross
}
REGRESSION_SAMPLES = 8
WORKERS = 2 if (os.cpu_count() or 1) > 1 else 1


def test_compare_accepts_rounding_and_rejects_wrong_values():
    x = torch.randn(64)
    compare("out", x + 1e-7, x, None)
    with pytest.raises(Mismatch, match="out"):
        compare("out", x + 1e-2, x, None)
    with pytest.raises(Mismatch, match=r"torch.float32\[1\], eager torch.float32\[\]"):
        compare("out", torch.zeros(1), torch.zeros(()), None)
    with pytest.raises(Mismatch, match="structure"):
        compare("out", (x,), [x], None)
    with pytest.raises(Mismatch, match="compiled gives 3"):
        compare("out", 3, 4, None)
    compare("out", float("nan"), float("nan"), None)


def test_compare_judges_a_reordered_sum_against_float64():
    # Eager and compiled both round; compiled passes while no further from float64 than eager.
    ref = torch.randn(4096, dtype=torch.float64) * 1e4
    eager = ref.float()
    near = eager + torch.where(torch.rand(4096) < 0.5, 1.0, -1.0) * eager.abs() * 6e-8
    compare("out", near, eager, ref)
    with pytest.raises(Mismatch, match="float64"):
        compare("out", eager * (1 + 1e-4), eager, ref)


def test_sweep_survives_a_hang_and_reports_it():
    cfg = SweepConfig(mode="float32", workers=1, timeout_s=0.01)
    (result,) = run_sweep(["add"], cfg)
    assert result.status == "timeout", result


def test_summary_counts_and_lists_failures():
    rs = [
        OpResult("add", "float32", "pass", kernels=1),
        OpResult("sort", "float32", "pass", fallback_ops={"aten.sort.default": 1}),
        OpResult("bad", "float32", "fail", "sample 0 output: off by 1"),
    ]
    text = summary(rs)
    assert "| float32 | 3 | 2 | 1 |" in text
    assert text.splitlines()[0].count("|") == text.splitlines()[2].count("|")
    assert "`sort.default` 1" in text
    assert "| bad | float32 | fail | sample 0 output: off by 1 |" in text


@pytest.mark.slow
def test_float32_slice_of_the_opinfo_sweep_passes():
    names = select(None)
    chosen = names[::STRIDE]
    results = run_sweep(chosen, SweepConfig(mode="float32", workers=WORKERS))
    assert [r.op for r in results] == chosen
    bad = [r for r in results if r.status in FAILING]
    assert not bad, summary(bad)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["float32", "grad", "bfloat16"])
def test_ops_that_once_compiled_wrong_pass(mode):
    chosen = sorted(op for op, modes in REGRESSIONS.items() if mode in modes)
    if not chosen:
        pytest.skip(f"no regression op in {mode}")
    cfg = SweepConfig(mode=mode, workers=WORKERS, samples=REGRESSION_SAMPLES)
    results = run_sweep(chosen, cfg)
    bad = [r for r in results if r.status != "pass"]
    assert not bad, summary(bad)
