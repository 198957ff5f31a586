"""The matmul padding: which products compute on a padded width, and that they still agree."""

import pytest
import torch
import torch.nn.functional as F
from loopir_testing import aten_graph

from kiln.loopir import BackendTraits, ReferenceBackend, matmul_padding, pad_matmuls


class _Aligning(ReferenceBackend):
    """The reference backend asking for 16-byte rows, as Triton's does for cuBLAS."""

    traits = BackendTraits(matmul_align_bytes=16)


@pytest.fixture(autouse=True)
def _small(monkeypatch):
    """Products this small are left alone in real graphs; here they keep the tests fast."""
    monkeypatch.setattr(matmul_padding, "MIN_ROWS", 8)
    monkeypatch.setattr(matmul_padding, "MIN_OUTPUT", 64)


def _linear(x, w, b):
    return F.linear(x, w, b).relu()


def _matmul(x, w, b):
    return torch.matmul(x, w.t()) + b


def _operator(x, w, b):
    return (x @ w.t()).sum(-1, keepdim=True) * b


@pytest.mark.parametrize("fn", [_linear, _matmul, _operator], ids=["linear", "matmul", "@"])
def test_unaligned_products_compute_a_padded_width(fn):
    """30 bfloat16 columns are 60 bytes: the product computes 32 and narrows to 30."""
    args = (torch.randn(2, 16, 24), torch.randn(30, 24), torch.randn(30))
    args = tuple(a.bfloat16() for a in args)
    want = fn(*args)
    gm = aten_graph(fn, *args)
    assert pad_matmuls(gm, _Aligning()) == 1
    (narrow,) = [n for n in gm.graph.nodes if n.target is torch.narrow]
    assert narrow.args[1:] == (-1, 0, 30)
    got = gm(*args)
    torch.testing.assert_close(got, want)


def test_the_result_is_a_view_of_the_padded_product():
    x, w = torch.randn(16, 24).bfloat16(), torch.randn(30, 24).bfloat16()
    gm = aten_graph(lambda x, w: F.linear(x, w), x, w)
    assert pad_matmuls(gm, _Aligning()) == 1
    out = gm(x, w)
    assert out.shape == (16, 30) and out.stride() == (32, 1)
    torch.testing.assert_close(out, F.linear(x, w))


def test_gradients_flow_through_the_padding():
    x = torch.randn(16, 24, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(30, 24, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(30, dtype=torch.bfloat16, requires_grad=True)
    gm = aten_graph(_linear, x.detach(), w.detach(), b.detach())
    assert pad_matmuls(gm, _Aligning()) == 1
    gm(x, w, b).float().square().sum().backward()
    got = [t.grad for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    _linear(x, w, b).float().square().sum().backward()
    for g, t in zip(got, (x, w, b), strict=True):
        assert g is not None and g.shape == t.shape
        torch.testing.assert_close(g, t.grad)


@pytest.mark.parametrize(
    ("cols", "dtype", "backend", "rows"),
    [
        (32, torch.bfloat16, _Aligning(), 16),  # aligned already
        (30, torch.bfloat16, ReferenceBackend(), 16),  # the backend does not ask
        (30, torch.bfloat16, _Aligning(), 4),  # too few rows to pay for the weight's copy
    ],
    ids=["aligned", "not-asked", "few-rows"],
)
def test_products_left_alone(cols, dtype, backend, rows):
    x, w = torch.randn(rows, 24, dtype=dtype), torch.randn(cols, 24, dtype=dtype)
    gm = aten_graph(lambda x, w: F.linear(x, w), x, w)
    assert pad_matmuls(gm, backend) == 0


@pytest.mark.parametrize("tf32", [False, True])
def test_float32_is_padded_only_where_tensor_cores_run_it(monkeypatch, tf32):
    """Without TF32 a float32 GEMM does not run on tensor cores, which want the alignment."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    x, w = torch.randn(16, 24), torch.randn(30, 24)
    gm = aten_graph(lambda x, w: F.linear(x, w), x, w)
    assert pad_matmuls(gm, _Aligning()) == (1 if tf32 else 0)
    torch.testing.assert_close(gm(x, w), F.linear(x, w))
