from fusion_programs import layer_norm_case, pointwise_after_reduction_case, softmax_case

from kiln.codegen_cpp.segments import Segment, reads_of, split_segments


def test_softmax_needs_three_loops():
    parts = split_segments(softmax_case().group.nodes)
    assert [len(p.nodes) for p in parts if isinstance(p, Segment)] == [1, 1, 1]


def test_welford_outputs_share_a_loop():
    parts = split_segments(layer_norm_case().group.nodes)
    assert [len(p.nodes) for p in parts] == [2, 1]


def test_x_nodes_run_between_loops():
    group = pointwise_after_reduction_case().group
    parts = split_segments(group.nodes)
    assert isinstance(parts[0], Segment) and not isinstance(parts[1], Segment)
    assert reads_of(group.nodes[1]) == {"buf0"}
