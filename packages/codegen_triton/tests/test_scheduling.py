"""The backend through loopir's whole pipeline: programs equal to eager, kernel counts."""

import pytest
import torch
from triton_testing import aten, check, kernel_sources

from kiln.codegen_triton import TritonBackend, TritonUnavailable, make_backend
from kiln.codegen_triton.scheduling import TritonBackend as Exported
from kiln.loopir import backend as loopir_backend


def test_pointwise_chain_is_one_kernel():
    c = check(lambda x: (aten.relu.default(aten.add.Tensor(x, 1.0)),), torch.randn(4, 8))
    assert c.kernel_count == 1
    (src,) = kernel_sources(c)
    assert "tl.load(in_ptr0 + (xindex), xmask" in src  # contiguous: no div/mod left


def test_softmax_is_one_persistent_kernel():
    c = check(lambda x: (aten._softmax.default(x, -1, False),), torch.randn(6, 40))
    assert c.kernel_count == 1
    (src,) = kernel_sources(c)
    assert "for roffset" not in src
    assert "out_ptr0 +" not in src  # the row max and sum stay in registers


def test_softmax_looped_when_rows_exceed_the_block():
    backend = TritonBackend()
    backend.options = type(backend.options)(persistent_reduction_limit=16)
    c = check(lambda x: (aten._softmax.default(x, -1, False),), torch.randn(5, 70), backend=backend)
    (src,) = kernel_sources(c)
    assert src.count("for roffset") == 3  # max; sum of exp; the output


def test_make_backend_and_registry():
    assert isinstance(make_backend("cpu"), Exported)  # the interpreter is on in these tests
    with pytest.raises(TritonUnavailable):
        make_backend("mps")
    loopir_backend.register_backend("cpu", TritonBackend())
    try:
        assert loopir_backend.get_backend("cpu").name == "triton"
    finally:
        loopir_backend.unregister_backend("cpu")


def test_empty_input_launches_nothing():
    check(lambda x: (aten.mul.Tensor(x, 2.0),), torch.randn(0, 3))


def test_max_autotune_option_widens_one_graph_only():
    from kiln.codegen_triton import TritonBackend, TritonOptions

    base = TritonBackend(TritonOptions(max_autotune=False, parallel_compile=False))
    tuned = base.with_options({"max_autotune": True, "cpp.threads": 2})
    assert tuned is not base and tuned.options.max_autotune is True
    assert base.options.max_autotune is False
    assert base.with_options({"fusion": False}) is base


def test_the_backend_is_the_whole_protocol_with_its_traits():
    backend = TritonBackend()
    assert isinstance(backend, loopir_backend.Backend)
    traits = backend.traits
    assert traits.matmul_align_bytes == 16 and traits.reduction_split_rows > 0
    assert traits.depthwise_nhwc and traits.convolution_weight_nhwc
    assert traits.convolution_bias_pointwise and traits.pointwise_cat
    backend.finalize()  # nothing is queued
