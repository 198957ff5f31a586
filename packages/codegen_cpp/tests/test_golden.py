"""Golden snapshots of the C++ generated for a dozen fixed programs.

A change in generated code shows up as a diff to review. To accept it, run
``KILN_UPDATE_GOLDEN=1 pytest packages/codegen_cpp/tests/test_golden.py`` and
commit the files under ``tests/golden/``. Generated with 16 lanes (AVX-512) so
the snapshots do not depend on the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from fusion_programs import (
    arange_where_case,
    embedding_case,
    half_chain_case,
    layer_norm_case,
    pad_case,
    pointwise_after_reduction_case,
    random_case,
    reduce_case,
    scatter_add_case,
    softmax_case,
    strided_case,
)

from kiln.codegen_cpp.kernel import KernelWriter

GOLDEN = Path(__file__).parent / "golden"
PROGRAMS = {
    "softmax": softmax_case,
    "softmax_rows": lambda: softmax_case(d=64),
    "layer_norm": layer_norm_case,
    "strided": strided_case,
    "pad": pad_case,
    "embedding": embedding_case,
    "scatter_add": scatter_add_case,
    "random": random_case,
    "arange_where": arange_where_case,
    "half_bf16": lambda: half_chain_case(torch.bfloat16),
    "mean": pointwise_after_reduction_case,
    "argmax_outer": lambda: reduce_case("argmax", torch.float32, 21, 19, inner=False),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_generated_cpp_matches_golden(name: str) -> None:
    text = KernelWriter(PROGRAMS[name]().group, name, 16).generate() + "\n"
    path = GOLDEN / f"{name}.cpp"
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with KILN_UPDATE_GOLDEN=1"
    assert text == path.read_text()
