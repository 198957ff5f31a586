"""2-D tiling: transposes read and write unit-stride along one tile axis each."""

import sympy
import torch
from triton_testing import aten, check, compile_fn, kernel_sources

from kiln.codegen_triton.tiling import YINDEX, choose_tile, split_index
from kiln.loopir import sizes
from kiln.loopir.kernel import XINDEX
from kiln.loopir.scheduler.order import KernelStep


def _group(compiled):
    return next(s.group for s in compiled.steps if isinstance(s, KernelStep))


def test_transpose_add_is_tiled_and_correct():
    x, y = torch.randn(40, 24), torch.randn(24, 40)
    c = check(lambda a, b: (aten.add.Tensor(a, aten.t.default(b)),), x, y)
    assert choose_tile(_group(c)) == 24
    (src,) = kernel_sources(c)
    assert "YBLOCK: tl.constexpr" in src
    assert "tl.load(in_ptr1 + (40*xindex + yindex)" in src  # unit stride along y
    assert "tl.store(out_ptr0 + (xindex + 24*yindex)" in src  # unit stride along x


def test_batched_permute_copy_is_tiled():
    x = torch.randn(3, 40, 24)

    def fn(t):
        return (
            aten.clone.default(
                aten.permute.default(t, [0, 2, 1]), memory_format=torch.contiguous_format
            ),
        )

    c = check(fn, x)
    assert choose_tile(_group(c)) == 40


def test_contiguous_and_small_kernels_stay_1d():
    c = compile_fn(lambda a: (aten.mul.Tensor(a, 2.0),), torch.randn(50, 30))
    assert choose_tile(_group(c)) is None
    c = compile_fn(
        lambda a, b: (aten.add.Tensor(a, aten.t.default(b)),), torch.randn(4, 6), torch.randn(6, 4)
    )
    assert choose_tile(_group(c)) is None  # too small to pay for a tile


def test_split_index_folds_digits():
    flat = sizes.FloorDiv(XINDEX, 24) + 40 * sizes.ModularIndexing(XINDEX, 1, 24)
    assert split_index(flat, 24, 40) == YINDEX + 40 * XINDEX
    assert split_index(XINDEX, 24, 40) == XINDEX + 24 * YINDEX
    assert split_index(sympy.Integer(5), 24, 40) == 5
