"""The matmul template with a fused epilogue, under the interpreter on small sizes."""

import torch

from kiln.codegen_triton.matmul import Epilogue, TritonMatmul

SMALL = (16, 16, 16, 4, 2)


def test_plain_matmul_with_ragged_edges():
    a, b = torch.randn(19, 23), torch.randn(23, 13)
    torch.testing.assert_close(
        TritonMatmul(Epilogue())(a, b, config=SMALL), a @ b, atol=1e-4, rtol=1e-4
    )


def test_bias_relu_epilogue_is_fused():
    ep = Epilogue(
        "tl.where(acc + e0 < 0, 0.0, acc + e0)", ((0, 1),), lambda acc, b: torch.relu(acc + b)
    )
    mm = TritonMatmul(ep)
    assert mm.source.count("tl.store(") == 1 and "e0_ptr" in mm.source
    a, b, bias = torch.randn(20, 24), torch.randn(24, 12), torch.randn(12)
    want = torch.relu(a @ b + bias)
    torch.testing.assert_close(mm(a, b, bias, config=SMALL), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mm.vendor(a, b, bias), want, atol=1e-4, rtol=1e-4)


def test_residual_epilogue_and_half_output():
    ep = Epilogue("acc * 0.5 + e0", ((12, 1),), lambda acc, r: acc * 0.5 + r)
    mm = TritonMatmul(ep, out_dtype=torch.bfloat16)
    a, b, res = torch.randn(17, 8), torch.randn(8, 12), torch.randn(17, 12)
    out = mm(a, b, res, config=SMALL)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, (0.5 * (a @ b) + res).bfloat16(), atol=2e-2, rtol=2e-2)
