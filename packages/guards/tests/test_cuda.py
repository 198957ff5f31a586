"""Guards on CUDA tensors and CUDA autocast (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from kiln import guards
from kiln.capture.guard_data import GlobalState, GuardKind, GuardSpec, TensorMeta
from kiln.capture.source import LocalSource

pytestmark = pytest.mark.gpu


def test_cuda_tensor_device_and_autocast():
    x = torch.randn(4, 4, device="cuda")
    check = guards.build_check(
        [
            GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, TensorMeta.of(x)),
            GuardSpec(None, GuardKind.GLOBAL_STATE, GlobalState.current()),
        ],
        lambda x: x,
    )
    assert check(torch.randn(4, 4, device="cuda"))
    assert not check(torch.randn(4, 4))
    assert "device mismatch: expected cuda:0, got cpu" in check.failure_reason(torch.randn(4, 4))
    with torch.autocast("cuda"):
        assert not check(x)
        assert "cuda autocast changed: expected False, got True" in check.failure_reason(x)
    assert check(x)
