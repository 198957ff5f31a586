"""Programs the differential fuzzer (tests/fuzz) found Kiln getting wrong, shrunk by hand.

Each test is differential against eager over a few calls; those marked ``xfail(strict=True)``
are known wrong in a layer the fuzzer does not fix, and start passing (failing the suite) once
that layer is fixed, so the mark is removed with the fix.
"""

from __future__ import annotations

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_strided_view_input_requiring_grad():
    f = kiln.compile(lambda y: y.square())
    for rows in (6, 5):
        base = torch.randn(rows, 4, requires_grad=True)
        y = base[:, 2:]  # strides (4, 1): not dense
        out = f(y)
        torch.testing.assert_close(out, y.square())
        (g,) = torch.autograd.grad(out.sum(), base)
        torch.testing.assert_close(g, torch.autograd.grad(y.square().sum(), base)[0])
