"""Hand-built loopir kernel groups (:mod:`kiln.loopir.testing`), run through the Triton
backend and the reference backend.

loopir's reference backend defines what a kernel computes; a case passes when
the Triton kernel (under the interpreter, or on a GPU) writes the same outputs.
"""

from __future__ import annotations

import dataclasses

import torch

from kiln.codegen_triton import TritonBackend
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.testing import Case, group, inp, outputs_for, pointwise, random_tensor, reduction

__all__ = ["Case", "group", "inp", "pointwise", "random_tensor", "reduction", "run_case"]


def run_case(case: Case, backend: TritonBackend | None = None, device: str = "cpu") -> None:
    """Both backends on the same fresh inputs; outputs must match."""
    inputs = [t.to(device) for t in case.make_inputs()]
    case = dataclasses.replace(
        case, group=dataclasses.replace(case.group, device=torch.device(device))
    )
    expected = outputs_for(case.group, device=device, fill=0)
    actual = outputs_for(case.group, device=device, fill=0)
    ReferenceBackend().codegen_kernel(case.group).fn(*inputs, *expected)
    (backend or TritonBackend()).codegen_kernel(case.group).fn(*inputs, *actual)
    for name, a, e in zip(case.group.outputs, actual, expected, strict=True):
        if name in case.group.internal:
            continue  # nothing after the kernel reads it: the Triton kernel may skip it
        torch.testing.assert_close(a, e, atol=case.atol, rtol=case.rtol, equal_nan=True)
