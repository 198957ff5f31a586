"""Fused kernels through the C++ backend equal loopir's reference backend (and eager)."""

from __future__ import annotations

import pytest
import torch
from fusion_programs import fusion_cases, softmax_case

from kiln.codegen_cpp import CppBackend
from kiln.codegen_cpp.kernel import KernelWriter
from kiln.loopir.reference import ReferenceBackend
from kiln.loopir.testing import Case, outputs_for, split_args

CASES = fusion_cases()


@pytest.fixture(scope="module")
def built() -> dict[str, object]:
    backend = CppBackend()
    kernels = {case.name: backend.codegen_kernel(case.group).fn for case in CASES}
    backend.finalize()
    return kernels


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fused_kernel_matches_reference(case: Case, built: dict[str, object]) -> None:
    inputs, initial = split_args(case.group, case.make_inputs())
    ours, ref = outputs_for(case.group, initial), outputs_for(case.group, initial)
    built[case.name](*inputs, *ours)  # type: ignore[operator]
    ReferenceBackend().codegen_kernel(case.group).fn(*inputs, *ref)
    for got, want in zip(ours, ref, strict=True):
        torch.testing.assert_close(got, want, equal_nan=True, atol=case.atol, rtol=case.rtol)


def test_softmax_equals_eager(built: dict[str, object]) -> None:
    case = next(c for c in CASES if c.name == "softmax-torch.float32")
    (x,) = case.make_inputs()
    outs = outputs_for(case.group)
    built[case.name](x, *outs)  # type: ignore[operator]
    torch.testing.assert_close(outs[2], torch.softmax(x, 1))


def test_results_do_not_depend_on_thread_count(built: dict[str, object]) -> None:
    case = next(c for c in CASES if c.name == "random")
    (seeds,) = case.make_inputs()
    results = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            (out,) = outputs_for(case.group)
            built[case.name](seeds, out)  # type: ignore[operator]
            results.append(out)
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert 0.3 < results[0].std().item() < 2.0


def test_structure_of_generated_code() -> None:
    writer = KernelWriter(softmax_case().group, "softmax", 16)
    text = writer.generate()
    assert text.count("for (int64_t rindex") == 6  # three loops, vector + tail each
    assert "kiln::Vec<float>::loadu" in text and writer.used_vector
    assert "// softmax: fuses max, sum, div" in text


@pytest.mark.parametrize("hw", [49, 64])
def test_per_channel_values_are_computed_once_per_row(hw: int) -> None:
    from fusion_programs import channel_rows_case

    text = KernelWriter(channel_rows_case(hw).group, "k", 16).generate()
    assert "for (int64_t xrow = 0; xrow < 40; ++xrow)" in text
    assert text.index("kiln::sqrt(") < text.index("for (int64_t xcol")
    assert "kiln::from_lanes" not in text
    assert ("for (int64_t xcol = 48; xcol < 49; ++xcol)" in text) == (hw == 49)


@pytest.mark.parametrize("c", [3, 12, 16])
def test_channels_last_per_channel_loads_read_a_table(c: int) -> None:
    from fusion_programs import channels_last_case

    text = KernelWriter(channels_last_case(c).group, "k", 8).generate()
    if c % 8 == 0:  # whole vectors: the load is contiguous already
        assert "table" not in text and "kiln::from_lanes" not in text
        return
    assert text.count("alignas(64) float table") == 2 and f"[{c + 8}];" in text
    assert text.count("kiln::Vec<float>::loadu(table") == 2
    assert f" + xindex % {c});" in text
    assert "kiln::from_lanes" not in text
    assert text.index("alignas(64) float table") < text.index("for (int64_t xindex")


def test_softmax_loops_share_exp_through_a_row_array() -> None:
    text = KernelWriter(softmax_case(d=64).group, "k", 16).generate()
    assert text.count("kiln::exp(") == 1
    assert "alignas(64) float row" in text and ".store(row" in text
    assert "::loadu(row" in text
    assert text.count("alignas(64)") == 1
    tail = KernelWriter(softmax_case(d=53).group, "k", 16).generate()
    assert tail.count("kiln::exp(") == 1 and tail.count("std::exp(") == 1  # and its scalar tail


def test_indirect_loads_vectorize_lane_by_lane() -> None:
    from fusion_programs import gathered_bias_softmax_case

    text = KernelWriter(gathered_bias_softmax_case().group, "k", 16).generate()
    assert "kiln::checked_index(t, 20)" in text and "in_ptr1[tmp" in text
    assert text.count("kiln::exp(") == 1


def test_large_kernels_get_an_omp_pragma() -> None:
    from kiln.codegen_cpp.loops import PARALLEL_MIN_WORK

    small = KernelWriter(softmax_case().group, "k", 16).generate()
    assert "#pragma omp" not in small
    big = KernelWriter(softmax_case(n=PARALLEL_MIN_WORK // 50, d=53).group, "k", 16).generate()
    assert "#pragma omp parallel for num_threads(nthreads)" in big


def test_few_long_rows_split_the_reduction_across_threads() -> None:
    from fusion_programs import reduce_case

    text = KernelWriter(reduce_case("argmin", torch.float32, 2, 40000).group, "k", 16).generate()
    assert "for (int64_t chunk = 0; chunk < nchunks; ++chunk)" in text
    assert "kiln::arg_merge<false>" in text
    assert text.index("#pragma omp parallel for") > text.index("for (int64_t xindex")


def test_out_of_bounds_indirect_index_raises(built: dict[str, object]) -> None:
    from kiln.codegen_cpp import KernelIndexError

    case = next(c for c in CASES if c.name == "embedding")
    table, idx = case.make_inputs()
    idx[3] = 50
    (out,) = outputs_for(case.group)
    with pytest.raises(KernelIndexError, match="index 50 is out of bounds"):
        built[case.name](table, idx, out)  # type: ignore[operator]
    idx[3] = -50  # wraps to 0: fine, and the error flag was reset
    built[case.name](table, idx, out)  # type: ignore[operator]
    with pytest.raises(IndexError):
        idx[0] = -51
        built[case.name](table, idx, out)  # type: ignore[operator]


def test_buffer_read_and_written_is_passed_twice(built: dict[str, object]) -> None:
    case = next(c for c in CASES if c.name == "inplace")
    (x,) = case.make_inputs()
    want = x * torch.sigmoid(x)
    built[case.name](x, x)  # type: ignore[operator]
    torch.testing.assert_close(x, want)


def test_long_float_sums_stay_accurate(built: dict[str, object]) -> None:
    for name in ("sum-torch.float32-20x60000-inner", "sum-torch.float32-2x300000-inner"):
        case = next(c for c in CASES if c.name == name)
        (x,) = case.make_inputs()
        x = x.abs() + 1.0  # no cancellation: the error is all rounding
        (out,) = outputs_for(case.group)
        built[name](x, out)  # type: ignore[operator]
        exact = x.double().sum(1)
        # A few roundings at the result's magnitude: eager's own error reaches 1.5 of these
        # units, a sequential float sum hundreds. (Bounding by eager's error on the same
        # input was flaky: eager's final rounding is sometimes near zero by luck.)
        unit = torch.finfo(torch.float32).eps * exact.abs().max().item()
        our_err = (out.double() - exact).abs().max().item()
        assert our_err <= 4 * unit, (our_err, unit)
