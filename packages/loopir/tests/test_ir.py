"""IR data: verify(), printing with the producing pass, views as strided windows, analysis."""

import pytest
import sympy
import torch

from kiln.loopir import IRVerificationError
from kiln.loopir.analysis import ReadWriteHandler
from kiln.loopir.ir.buffers import ComputedBuffer, InputBuffer
from kiln.loopir.ir.layout import Layout, contiguous_layout
from kiln.loopir.ir.loops import Pointwise, Reduction
from kiln.loopir.ir.strided import as_strided_view
from kiln.loopir.ir.views import StorageBox, TensorBox, View
from kiln.loopir.printing import render_buffers
from kiln.loopir.virtualized import ops, set_ops_handler

CPU = torch.device("cpu")
S = sympy.Integer


def _input(shape=(4, 6)):
    size = tuple(S(s) for s in shape)
    return InputBuffer("x", contiguous_layout(CPU, torch.float32, size, flexible=False))


def test_verify_catches_bad_nodes():
    x = _input()
    bad = Reduction(CPU, torch.float32, (S(4),), "test", (S(6),), "median", torch.float32)
    with pytest.raises(IRVerificationError, match="unknown reduction"):
        bad.verify()
    pw = Pointwise(CPU, torch.float32, (S(4), S(6)), "test", x.make_loader())
    buf = ComputedBuffer("buf0", contiguous_layout(CPU, torch.float32, (S(4),)), pw)
    with pytest.raises(IRVerificationError, match="computation size"):
        buf.verify()
    with pytest.raises(IRVerificationError):
        Layout(CPU, torch.float32, (S(2),), ()).verify()


def test_printed_ir_names_its_pass_and_ops():
    x = _input()
    load = x.make_loader()
    pw = Pointwise(CPU, torch.float32, (S(4), S(6)), "aten.sin", lambda i: ops.sin(load(i)))
    buf = ComputedBuffer("buf0", contiguous_layout(CPU, torch.float32, (S(4), S(6))), pw)
    text = render_buffers([buf], "lower")
    assert text.splitlines()[0] == "# loopir IR after pass 'lower'"
    assert "tmp1 = sin(tmp0)" in text and "store(buf0, 6*i0 + i1, tmp1)" in text


def test_affine_views_become_strided_windows_and_others_do_not():
    x = _input()
    box = TensorBox(StorageBox(x))
    transposed = TensorBox(View(box.data, (S(6), S(4)), lambda i: [i[1], i[0]], "permute"))
    found = as_strided_view(transposed)
    assert found is not None and found.layout.stride == (1, 6)
    flipped = TensorBox(View(box.data, (S(4), S(6)), lambda i: [3 - i[0], i[1]], "flip"))
    assert as_strided_view(flipped) is None


def test_read_write_analysis_counts_and_addresses():
    x = _input()
    load = x.make_loader()
    handler = ReadWriteHandler()
    i = [sympy.Symbol("i0"), sympy.Symbol("i1")]
    with set_ops_handler(handler):
        ops.store("out", S(0), ops.add(load(i), ops.exp(load([i[0], S(0)]))))
    assert [d.index for d in handler.reads] == [6 * i[0] + i[1], 6 * i[0]]
    assert handler.op_counts["load"] == 2 and handler.compute_ops() == 4
