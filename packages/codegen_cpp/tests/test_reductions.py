import torch

from kiln.codegen_cpp.ops import CppVar
from kiln.codegen_cpp.reductions import Accumulator


def test_identities_and_updates():
    acc = Accumulator("acc0", "max", torch.float32)
    assert acc.declarations() == ["float acc0 = -std::numeric_limits<float>::infinity();"]
    assert (
        acc.update(CppVar("t", torch.float32), vector=False) == "acc0 = kiln::scalar_max(acc0, t);"
    )
    ints = Accumulator("acc1", "min", torch.int64)
    assert "std::numeric_limits<int64_t>::max()" in ints.declarations()[0]


def test_vectorized_accumulators_fold_their_lanes():
    acc = Accumulator("acc0", "sum", torch.float32, vectorized=True)
    assert len(acc.declarations()) == 2
    assert acc.fold_lanes() == ["acc0 = acc0 + kiln::reduce_sum(acc0_vec);"]
    assert acc.cascade_flush()  # long float sums add blocks separately


def test_argmax_and_welford_results():
    arg = Accumulator("acc0", "argmax", torch.float32)
    assert arg.results() == CppVar("acc0_idx", torch.int64)
    wf = Accumulator("acc1", "welford_reduce", torch.float64, row_lanes=True)
    assert [v.name for v in wf.results()] == ["acc1_mean_vec", "acc1_m2_vec", "acc1_weight_vec"]
    assert wf.fold_lanes() == []
    assert (
        "kiln::welford_merge"
        in Accumulator("a", "welford_reduce", torch.float32).merge_partial("c")[0]
    )
