"""Tensors with zero elements through compiled code: never a read past an input's end.

A loop whose range is empty never runs its body, but a kernel may compute what the body reads
outside it (a loop-invariant index loaded from a tensor of zero elements); such a read crashed
the process. The cases mix indexing by a data-dependent (possibly empty) index with reductions,
across calls whose sizes go to zero and back.
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


def gathered(x):
    v = x[(x > 0).nonzero()[:, 0]]  # a data-dependent index: a graph break before it
    return v.norm(), v.sum(0), v.mean(), v.prod(), v.var(0), (v > 1).any(), v


def gathered_by(x, idx):
    v = x[idx]
    return v.sum(), v.sum(1), v.amax(1), v.std(1), v


@pytest.mark.parametrize("backend", ["kiln", "aot_eager"])
def test_reductions_of_an_empty_gather(backend):
    cf = kiln.compile(gathered, backend=backend)
    for n, m in [(2, 1), (0, 4), (3, 4), (0, 1)]:
        x = torch.randn(n, m)
        torch.testing.assert_close(cf(x), gathered(x), equal_nan=True)


def test_gather_by_an_empty_index_then_reduce_over_rows():
    cf = kiln.compile(gathered_by)
    for rows in (0, 3, 0):
        x = torch.randn(rows, 5)
        idx = torch.randint(0, max(rows, 1), (rows,)) if rows else torch.zeros(0, dtype=torch.long)
        torch.testing.assert_close(cf(x, idx), gathered_by(x, idx), equal_nan=True)
