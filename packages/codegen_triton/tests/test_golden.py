"""Golden snapshots of the Triton source for ten fixed programs (``tests/golden/*.txt``).

A change in generated code shows up as a diff to review. Regenerate with
``KILN_UPDATE_GOLDEN=1 python -m pytest packages/codegen_triton/tests/test_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from triton_testing import aten, aten_graph, to_meta

from kiln.codegen_triton import TritonBackend, TritonOptions
from kiln.loopir import compile_graph
from kiln.loopir.scheduler.order import KernelStep

GOLDEN = Path(__file__).parent / "golden"


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


PROGRAMS = {
    "pointwise_chain": (lambda x: (aten.sigmoid.default(aten.mul.Tensor(aten.exp.default(x), 2.0)),), [_r(16, 32)]),
    "softmax": (lambda x: (aten._softmax.default(x, -1, False),), [_r(8, 100)]),
    "softmax_looped": (lambda x: (aten._softmax.default(x, -1, False),), [_r(8, 3000)]),
    "layer_norm": (lambda x, w, b: (aten.native_layer_norm.default(x, [64], w, b, 1e-5)[0],), [_r(8, 64), _r(64), _r(64)]),
    "var_mean": (lambda x: aten.var_mean.correction(x, [1], correction=1), [_r(8, 40)]),
    "argmax": (lambda x: (aten.argmax.default(x, 1),), [_r(8, 40)]),
    "transpose_add": (lambda x, y: (aten.add.Tensor(x, aten.t.default(y)),), [_r(64, 32), _r(32, 64)]),
    "embedding": (lambda t, i: (aten.embedding.default(t, i),), [_r(100, 16), torch.randint(0, 100, (20,))]),
    "pad_cat": (lambda x, y: (aten.cat.default([aten.constant_pad_nd.default(x, [1, 1]), y], 1),), [_r(8, 6), _r(8, 4)]),
    "dropout_bf16": (lambda x: (aten.native_dropout.default(x, 0.25, True)[0],), [_r(8, 33, dtype=torch.bfloat16)]),
}  # fmt: skip


def generated(name: str) -> str:
    fn, inputs = PROGRAMS[name]
    # the limit the goldens were written with: softmax_looped (3000 columns) stays looped
    backend = TritonBackend(TritonOptions(parallel_compile=False, persistent_reduction_limit=1024))
    compiled = compile_graph(aten_graph(fn, *inputs), [to_meta(t) for t in inputs], backend=backend)
    kernels = [s.code.source for s in compiled.steps if isinstance(s, KernelStep)]
    return f"# golden: {name}\n" + "\n# ----\n".join(kernels)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_golden(name):
    path = GOLDEN / f"{name}.txt"
    text = generated(name)
    if os.environ.get("KILN_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(text)
    assert text == path.read_text(), f"generated Triton for {name} changed; review and regenerate"
