"""Inputs Kiln does not compile, and tensors without data: eager's answer, a clear reason.

Sparse (COO, CSR, CSC, BSR), nested, quantized and MKL-DNN tensors have no fake that models
them and no storage a kernel could read: the function runs eagerly, with one graph break of
kind ``unsupported_tensor`` and no internal error logged. Tensors on the meta device have no
data at all: their graphs run as captured (ATen's meta kernels), never as generated kernels.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import kiln

BACKENDS = ["kiln", "aot_eager"]


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _dense():
    return torch.randn(4, 6)


def _quantized():
    with warnings.catch_warnings():  # quantized dtypes are deprecated, still supported
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(_dense(), 0.1, 10, torch.quint8)


def _nested():
    with warnings.catch_warnings():  # the strided layout of nested tensors is a prototype
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(2, 6), torch.randn(3, 6)])


def _csr():
    with warnings.catch_warnings():  # sparse CSR support is in beta
        warnings.simplefilter("ignore")
        return _dense().to_sparse_csr()


UNCOMPILED = {
    "coo": lambda: _dense().to_sparse(),
    "csr": _csr,
    "csc": lambda: _dense().to_sparse_csc(),
    "bsr": lambda: _dense().to_sparse_bsr((2, 2)),
    "nested": _nested,
    "quantized": _quantized,
    "mkldnn": lambda: _dense().to_mkldnn(),
}


def _plain(t):
    if t.is_quantized:
        return t.dequantize()
    if t.is_nested:
        return torch.cat(t.unbind())
    return t.to_dense() if t.layout != torch.strided else t


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(UNCOMPILED))
def test_inputs_of_other_layouts_run_eagerly_with_one_reason(backend, kind, caplog):
    def fn(x):
        return torch.relu(x), x * 1 if kind != "quantized" else x

    compiled = kiln.compile(fn, backend=backend)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            x = UNCOMPILED[kind]()
            for got, want in zip(compiled(x), fn(x), strict=True):
                assert got.layout == want.layout
                torch.testing.assert_close(_plain(got), _plain(want))
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert kiln.counters.snapshot()["graph_breaks"] == {"unsupported_tensor": 1}


def test_the_reason_names_the_input_and_its_layout(caplog):
    assert "unsupported_tensor" in str(kiln.explain(lambda x: x * 2)(_csr()))
    with caplog.at_level(logging.DEBUG, logger="kiln.frontend.graph_breaks"):
        kiln.compile(lambda x: x * 2)(_csr())
    assert "L['x'] (sparse_csr layout)" in caplog.text


META_PROGRAMS = {
    "input": lambda x: (x * 2 + 1, x.sum(0), x.t().contiguous()),
    "made_inside": lambda x: (torch.zeros(3, device="meta") + 1, x * 2),
    "moved_there": lambda x: (x.to("meta") * 2, torch.empty_like(x, device="meta").t(), x + 1),
}


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", [*BACKENDS, "loopir_reference"])
@pytest.mark.parametrize("name", list(META_PROGRAMS))
def test_tensors_on_the_meta_device(backend, name):
    """A kernel given a meta tensor would read address 0; the graph runs ATen's meta kernels."""
    fn = META_PROGRAMS[name]
    compiled = kiln.compile(fn, backend=backend)
    for rows in (4, 4, 5):
        x = torch.empty(rows, 6, device="meta" if name == "input" else "cpu")
        for got, want in zip(compiled(x), fn(x), strict=True):
            assert (got.device, got.shape, got.stride()) == (want.device, want.shape, want.stride())


@pytest.mark.filterwarnings("error:kiln")
@pytest.mark.parametrize("backend", [*BACKENDS, "loopir_reference"])
def test_a_module_on_the_meta_device_and_its_backward(backend):
    """Parameters moved to the meta device (as for sizing a model before loading weights)."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = model.to("meta")
    compiled = kiln.compile(model, backend=backend)
    for rows in (4, 4, 7):
        x = torch.empty(rows, 6, device="meta", requires_grad=True)
        got, want = compiled(x), model(x)
        assert (got.device, got.shape) == (want.device, want.shape)
        got.sum().backward()
        assert (x.grad.device, x.grad.shape) == (torch.device("meta"), x.shape)
