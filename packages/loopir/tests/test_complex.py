"""Complex values stay with ATen: no kernel computes them, no lazy bit is dropped."""

import torch
from loopir_testing import aten_graph, compile_fn, to_meta

from kiln.loopir import get_backend
from kiln.loopir.pipeline import compile_graph

aten = torch.ops.aten


def _no_complex_kernels(compiled):
    """Every kernel's buffers are real: complex calls are ATen calls from the wrapper."""
    for step in compiled.steps:
        group = getattr(step, "group", None)
        if group is not None:
            dtypes = {layout.dtype for layout in group.buffers.values()}
            assert not any(d.is_complex for d in dtypes), (group.name, dtypes)


def _run_twice(fn, make, *, generated=False):
    """Compile ``fn`` once and compare it with eager on two fresh inputs, which it must not
    modify. ``generated``: with the code generator registered for CPUs, whose kernels read
    storage (the reference backend's torch ops would resolve a lazy bit themselves)."""
    if generated:
        example = make()
        gm = aten_graph(fn, *example)
        metas = [to_meta(t) for t in example]
        compiled = compile_graph(gm, metas, backend=get_backend("cpu"))
    else:
        compiled = compile_fn(fn, *make())
    _no_complex_kernels(compiled)
    for _ in range(2):
        inputs = make()
        before = [t.clone() for t in inputs]
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))
        for t, b in zip(inputs, before, strict=True):
            assert torch.equal(t, b), "the compiled graph wrote into its input"
    return compiled


def _z():
    return (torch.randn(6, 5, dtype=torch.complex64),)


def test_abs_and_product_with_a_conjugate():
    _run_twice(lambda z: aten.abs.default(z), _z)
    _run_twice(lambda z: aten.mul.Tensor(z, aten._conj.default(z)), _z)
    _run_twice(
        lambda z: aten.abs.default(aten.mul.Tensor(aten._conj.default(z), aten.sin.default(z))),
        _z,
    )


def test_real_results_of_complex_values_feed_kernels():
    def fn(z):
        prod = aten.mul.Tensor(z, aten._conj.default(z))
        re = aten.select.int(aten.view_as_real.default(prod), -1, 0)
        return aten.add.Tensor(aten.mul.Tensor(re, 2.0), 1.0)

    _run_twice(fn, _z)


def test_the_imaginary_part_of_a_conjugate_is_negated_in_kernels():
    """``imag`` of a conjugate is a view with the negative bit; a kernel reads it resolved."""

    def fn(z):
        return aten.mul.Tensor(aten.imag.default(aten._conj.default(z)), 3.0)

    _run_twice(fn, _z, generated=True)


def test_complex_results_of_real_inputs():
    def make():
        return torch.rand(4, 3) + 0.1, torch.randn(4, 3)

    _run_twice(lambda r, t: aten.abs.default(aten.polar.default(r, t)), make)
    _run_twice(lambda r, t: aten.mul.Tensor(aten.complex.default(r, t), 2.0), make)
    _run_twice(lambda r, t: aten.mul.Tensor(r, 1j), make)


def test_a_view_of_an_input_is_never_overwritten():
    """``view_as_real`` is the input's storage: the kernel after it writes a new buffer."""

    def fn(z):
        return aten.mul.Tensor(aten.view_as_real.default(z), 2.0)

    compiled = _run_twice(fn, _z)
    assert "inplace" not in compiled.source
