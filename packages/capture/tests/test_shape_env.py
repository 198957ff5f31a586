"""The shape environment and Kiln's SymNode: symbolic sizes through meta kernels, the guards
decisions add, and those guards checked on new sizes.

Shape checks are differential: an op's symbolic output sizes, evaluated at fresh input sizes
that pass the recorded guards, equal eager's sizes on real tensors of those sizes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sympy
import torch
import torch.nn.functional as F

from kiln.capture.shapes import (
    FloorDiv,
    ShapeEnv,
    SymbolicMetaMode,
    SymNode,
    describe_failure,
    expr_code,
    expr_of,
    failing_guards,
    guard_code,
    symbolic_meta,
    values_of,
)
from kiln.capture.source import LocalSource, SizeSource, StrideSource

Shape = Sequence[int]


def _metas(env: ShapeEnv, shapes: Sequence[Shape], **kw: Any) -> list[torch.Tensor]:
    return [
        symbolic_meta(torch.empty(s), LocalSource(f"a{i}"), env, **kw) for i, s in enumerate(shapes)
    ]


def _evaluate(value: Any, values: dict[sympy.Symbol, int]) -> int:
    return int(expr_of(value).xreplace({s: sympy.Integer(v) for s, v in values.items()}))


def _frame(reals: Sequence[torch.Tensor]) -> dict[str, Any]:
    return {f"a{i}": t for i, t in enumerate(reals)}


def check_sizes(
    fn: Callable[..., torch.Tensor],
    shapes: Sequence[Shape],
    new_shapes: Sequence[Sequence[Shape]],
    *,
    expect_reuse: int = 1,
) -> ShapeEnv:
    """Trace ``fn`` on symbolic metas of ``shapes``; for each of ``new_shapes`` the guards
    decide reuse, and where they pass the symbolic output sizes equal eager's."""
    env = ShapeEnv()
    with SymbolicMetaMode():
        out = fn(*_metas(env, shapes))
    reused = 0
    for shapes_now in new_shapes:
        reals = [torch.randn(s) for s in shapes_now]
        values = values_of(env, _frame(reals))
        if failing_guards(env, values):
            continue
        reused += 1
        expected = fn(*reals).shape
        assert [_evaluate(d, values) for d in out.shape] == list(expected), (shapes_now, out.shape)
    assert reused >= expect_reuse
    return env


def decided(env: ShapeEnv) -> list[str]:
    """The text of the guards decisions added (the symbols' ranges left out)."""
    return [expr_code(env, g.expr) for g in env.recorded]


# -- symbolic sizes through meta kernels and decompositions ---------------------------------


def test_meta_strides_are_contiguous_in_the_same_symbols() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(4, 8, 16)])
    s0, s1, s2 = (expr_of(d) for d in x.shape)
    assert all(isinstance(s, sympy.Symbol) for s in (s0, s1, s2))
    assert [expr_of(s) for s in x.stride()] == [s1 * s2, s2, 1]
    assert x.is_contiguous() and env.recorded == []
    assert [str(env.source_of(s)) for s in (s0, s1, s2)] == [
        "L['a0'].size()[0]",
        "L['a0'].size()[1]",
        "L['a0'].size()[2]",
    ]


def test_transposed_input_keeps_its_layout_and_a_strided_slice_its_strides() -> None:
    env = ShapeEnv()
    t = symbolic_meta(torch.empty(6, 5).t(), LocalSource("t"), env)
    s1, s0 = (expr_of(d) for d in t.shape)
    assert [expr_of(s) for s in t.stride()] == [1, s1]
    sliced = symbolic_meta(torch.empty(6, 10)[:, ::2], LocalSource("u"), env)
    assert sliced.stride() == (10, 2)
    assert "L['u'].stride()[0] == 10" in guard_code(env)


def test_matmul() -> None:
    env = check_sizes(
        lambda x, w: x @ w, [(3, 5, 6), (6, 7)], [[(4, 9, 6), (6, 7)], [(2, 2, 6), (6, 3)]]
    )
    # the contracted dims are equal (duck-sized: one symbol, one guard)
    assert decided(env) == ["L['a0'].size()[2] == L['a1'].size()[0]"]


def test_view_and_reshape_with_minus_one() -> None:
    new = [[(5, 7, 3)], [(2, 2, 9)], [(8, 3, 4)]]
    check_sizes(lambda x: x.view(-1, x.size(-1)), [(4, 6, 5)], new, expect_reuse=3)
    check_sizes(lambda x: x.reshape(x.size(0), -1), [(4, 6, 5)], new, expect_reuse=3)
    # -1 is a quotient of symbols: whether it divides evenly is guarded (odd sizes fail)
    env = check_sizes(lambda x: x.flatten(1).view(x.size(0), -1, 2), [(4, 6, 5)], [[(3, 4, 7)]])
    assert failing_guards(env, values_of(env, {"a0": torch.empty(3, 5, 7)}))


def _python_dispatcher_on() -> bool:
    return torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)


def test_mode_runs_composites_in_python_and_only_while_inside() -> None:
    # matmul's C++ composite kernel reads numel() as an int on some torch versions; its
    # Python kernel, which the mode's Python dispatcher runs, keeps the sizes symbolic
    env = ShapeEnv()
    x, w = _metas(env, [(3, 5, 6), (6, 7)])
    assert not _python_dispatcher_on()
    with SymbolicMetaMode():
        assert _python_dispatcher_on()
        with SymbolicMetaMode():
            out = torch.matmul(x, w)
        assert _python_dispatcher_on()
    assert not _python_dispatcher_on()
    assert [str(expr_of(d)) for d in out.shape] == ["s0", "s1", "s4"]
    with pytest.raises(ValueError), SymbolicMetaMode():
        raise ValueError
    assert not _python_dispatcher_on()


def test_cat_adds_the_symbols() -> None:
    env = ShapeEnv()
    x, y = _metas(env, [(3, 8), (5, 8)])
    with SymbolicMetaMode():
        out = torch.cat([x, y])
    assert expr_of(out.shape[0]) == expr_of(x.shape[0]) + expr_of(y.shape[0])
    check_sizes(lambda x, y: torch.cat([x, y], 1), [(3, 4), (3, 6)], [[(7, 2), (7, 9)]])


def test_broadcast_add() -> None:
    check_sizes(lambda x, b: x + b, [(4, 6), (6,)], [[(7, 3), (3,)], [(2, 9), (9,)]])
    env = check_sizes(lambda x, b: x + b, [(4, 6), (1, 6)], [[(7, 3), (1, 3)]])
    assert "L['a1'].size()[0] == 1" in guard_code(env)
    # a size-1 input dim broadcasts against whatever size comes (specialized, so no symbol)
    check_sizes(lambda x, y: x * y, [(4, 1, 5), (3, 5)], [[(6, 1, 2), (7, 2)]])


def test_sum_over_a_dim() -> None:
    env = check_sizes(lambda x: x.sum(1), [(4, 6, 5)], [[(2, 9, 3)], [(8, 3, 7)]], expect_reuse=2)
    assert env.recorded == []
    check_sizes(lambda x: x.mean(-1, keepdim=True), [(4, 6)], [[(9, 3)]])


def test_conv2d_output_size() -> None:
    weight = torch.randn(8, 3, 3, 3)

    def conv(x: torch.Tensor) -> torch.Tensor:
        w = weight.to("meta") if x.device.type == "meta" else weight
        return F.conv2d(x, w, stride=2, padding=1)

    env = check_sizes(conv, [(2, 3, 32, 40)], [[(4, 3, 17, 29)], [(3, 3, 64, 9)]], expect_reuse=2)
    env2 = ShapeEnv()
    (x,) = _metas(env2, [(2, 3, 32, 40)])
    with SymbolicMetaMode():
        out = conv(x)
    h = expr_of(x.shape[2])
    assert expr_of(out.shape[2]) == FloorDiv(h - 1, 2) + 1
    assert "L['a0'].size()[1] == 3" in guard_code(env)


def test_view_from_the_inputs_shape() -> None:
    heads = 4

    def split_heads(x: torch.Tensor) -> torch.Tensor:
        b, s, hidden = x.shape
        return x.view(b, s, heads, hidden // heads).transpose(1, 2)

    env = check_sizes(split_heads, [(2, 5, 16)], [[(3, 7, 16)], [(4, 9, 32)]], expect_reuse=2)
    with SymbolicMetaMode():
        out = split_heads(_metas(ShapeEnv(), [(2, 5, 16)])[0])
    assert str(expr_of(out.shape[3])) == "FloorDiv(s2, 4)"
    # the view is valid where the hidden size divides by the heads, and its strides depend
    # on whether the head size is 1
    assert decided(env) == ["(L['a0'].size()[2] % 4) == 0", "L['a0'].size()[2] != 4"]
    assert all(g.origin.startswith(f"{__file__}:") for g in env.recorded)
    assert failing_guards(env, values_of(env, {"a0": torch.empty(3, 7, 18)}))


@pytest.mark.parametrize(
    "fn, shape, new",
    [
        (lambda x: x[:, : x.size(1) - 1], (3, 6), (5, 9)),
        (lambda x: x[..., 1:], (3, 6), (4, 2)),
        (lambda x: x[:, None].expand(-1, 4, -1), (3, 6), (5, 7)),
        (lambda x: x.permute(2, 0, 1).contiguous(), (3, 6, 5), (4, 2, 7)),
        (lambda x: x.transpose(0, 1).reshape(-1), (3, 6), (5, 4)),
        (lambda x: F.pad(x, (1, 2)), (3, 6), (5, 2)),
        (lambda x: x.softmax(-1).cumsum(0), (3, 6), (7, 2)),
        (
            lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True),
            (2, 3, 5, 4),
            (3, 2, 7, 6),
        ),
        (lambda x: x.unfold(1, 2, 1), (4, 5), (6, 3)),
        (lambda x: torch.stack([x, x.new_zeros(x.shape)], -1), (4, 5), (2, 9)),
        (lambda x: x.to(memory_format=torch.channels_last).sum(1), (2, 3, 4, 5), (3, 4, 5, 6)),
    ],
    ids=[
        "slice",
        "slice_to_end",
        "expand",
        "permute_contiguous",
        "transposed_reshape",
        "pad",
        "softmax_cumsum",
        "sdpa",
        "unfold",
        "stack_new_zeros",
        "channels_last",
    ],
)
def test_ops_keep_sizes_symbolic_without_guards(fn: Any, shape: Shape, new: Shape) -> None:
    # a kernel reading sizes as plain ints would specialize every size it touched
    env = check_sizes(fn, [shape], [[new]])
    assert env.recorded == [], guard_code(env)


# -- decisions and the guards they record ---------------------------------------------------


def test_branch_records_the_relation_not_the_value() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(20, 3)])
    taken = x.size(0) > 16
    assert bool(taken) is True
    assert [g.expr for g in env.recorded] == [sympy.Gt(expr_of(x.shape[0]), 16)]
    assert decided(env) == ["L['a0'].size()[0] > 16"]
    assert env.guards[0].origin.startswith(f"{__file__}:")  # the user's line that asked
    for n, holds in [(17, True), (100, True), (16, False), (3, False)]:
        assert not failing_guards(env, values_of(env, {"a0": torch.empty(n, 3)})) == holds


def test_the_branch_not_taken_is_guarded_by_the_negation() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(8, 3)])
    if x.size(0) > 16:
        pytest.fail("the hint is 8")
    assert decided(env) == ["L['a0'].size()[0] <= 16"]


def test_guards_are_deduplicated_and_implied_ones_not_recorded() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(20, 3)])
    for _ in range(3):
        assert x.size(0) > 16
    assert x.size(0) > 10  # implied by s0 > 16: the range answers it
    assert x.size(0) >= 17
    assert len(env.recorded) == 1


def test_zero_and_one_specialize() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(0, 1, 5)])
    assert x.shape[0] == 0 and type(x.shape[0]) is int
    assert x.shape[1] == 1 and type(x.shape[1]) is int
    assert isinstance(x.shape[2], torch.SymInt)
    assert decided(env) == ["L['a0'].size()[0] == 0", "L['a0'].size()[1] == 1"]
    values = values_of(env, {"a0": torch.empty(0, 7, 5)})
    (failed,) = failing_guards(env, values)
    assert describe_failure(env, failed, values) == "L['a0'].size()[1] == 1 failed: got 7"
    assert not failing_guards(env, values_of(env, {"a0": torch.empty(0, 1, 9)}))


def test_symbols_ranges_are_guarded() -> None:
    # reasoning assumed every symbol is at least 2 (s0 == 1 was answered False): a size 1 or 0
    # there must fail the guards, or broadcasting and contiguity answers would be stale
    env = ShapeEnv()
    (x,) = _metas(env, [(4, 6)])
    assert not bool(x.size(0) == 1) and env.recorded == []
    assert guard_code(env) == ["L['a0'].size()[0] >= 2", "L['a0'].size()[1] >= 2"]
    for n in (0, 1):
        values = values_of(env, {"a0": torch.empty(n, 6)})
        (failed,) = failing_guards(env, values)
        assert describe_failure(env, failed, values) == f"L['a0'].size()[0] >= 2 failed: got {n}"
    # a marked range is guarded at both ends; a bound a decision tightened is implied by it
    env = ShapeEnv()
    x = symbolic_meta(torch.empty(8, 5), LocalSource("x"), env, ranges={0: (4, 64)})
    assert bool(x.size(1) > 3)
    assert guard_code(env) == [
        "L['x'].size()[1] > 3",
        "L['x'].size()[0] >= 4",
        "L['x'].size()[0] <= 64",
    ]
    assert failing_guards(env, values_of(env, {"x": torch.empty(65, 5)}))
    # two symbols found equal keep both ranges
    env = ShapeEnv(duck_shape=False)
    x = symbolic_meta(torch.empty(8), LocalSource("x"), env)
    y = symbolic_meta(torch.empty(8), LocalSource("y"), env, ranges={0: (4, 64)})
    assert bool(x.size(0) == y.size(0))
    assert guard_code(env) == [
        "L['x'].size()[0] == L['y'].size()[0]",
        "L['x'].size()[0] >= 4",
        "L['x'].size()[0] <= 64",
    ]


def test_without_zero_one_specialization_sizes_stay_symbolic() -> None:
    env = ShapeEnv(specialize_zero_one=False)
    (x,) = _metas(env, [(1, 5)])
    assert isinstance(x.shape[0], torch.SymInt)
    # a size that may be 0 makes the allocation ask, and that answer is guarded
    assert "L['a0'].size()[0] != 0" in guard_code(env)


def test_duck_sizing_shares_a_symbol_with_a_guard() -> None:
    env = ShapeEnv()
    x, y = _metas(env, [(4, 8), (8, 4)])
    assert expr_of(y.shape[0]) == expr_of(x.shape[1])
    assert expr_of(y.shape[1]) == expr_of(x.shape[0])
    assert decided(env) == [
        "L['a0'].size()[1] == L['a1'].size()[0]",
        "L['a0'].size()[0] == L['a1'].size()[1]",
    ]
    with SymbolicMetaMode():
        assert (x + y.t()).shape == x.shape
    assert len(env.recorded) == 2  # equal symbols broadcast without another guard
    frame = {"a0": torch.empty(5, 9), "a1": torch.empty(9, 6)}
    (failed,) = failing_guards(env, values_of(env, frame))
    assert "L['a0'].size()[0] == L['a1'].size()[1] failed" in describe_failure(
        env, failed, values_of(env, frame)
    )


def test_without_duck_sizing_equal_sizes_get_their_own_symbols() -> None:
    env = ShapeEnv(duck_shape=False)
    x, y = _metas(env, [(4, 8), (4, 8)])
    assert expr_of(x.shape[0]) != expr_of(y.shape[0]) and env.recorded == []
    with SymbolicMetaMode():
        out = x + y  # broadcasting asks whether the sizes are equal: the answer is guarded
    assert "L['a0'].size()[0] == L['a1'].size()[0]" in guard_code(env)
    assert expr_of(out.shape[0]) == expr_of(x.shape[0])  # the equality became a replacement


def test_value_ranges_answer_without_guards() -> None:
    env = ShapeEnv()
    x, y = _metas(env, [(4, 6), (5, 7)])
    a, b = x.size(0), y.size(1)
    assert bool(a >= 2) and bool(a != 1) and not bool(a == 0) and not bool(a == 1)
    assert bool(a * b > 1) and bool(a + b >= 4) and not bool(a * b < a)
    assert bool(a // 2 >= 1) and bool(a % 3 < 3)
    assert env.recorded == []
    assert env.static_value(expr_of(a) > 3) is None  # not decided by ranges alone


def test_ranges_reduce_max_mod_and_floordiv() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(9, 5)])
    a, b = x.size(0), x.size(1)
    out = (a - 1) // 2 + 1
    assert bool(torch.sym_max(1, out) == out) and bool(torch.sym_min(a, a * b) == a)
    assert bool(a % (a * b) == a) and bool((a // (a * b)) == 0)
    assert expr_of((576 * a * b) // (64 * a * b)) == 9
    assert env.recorded == []
    # a real question (is the output size 1?) is recorded without the max around it
    assert bool(torch.sym_max(1, out) != 1)
    (text,) = decided(env)
    assert "max" not in text
    assert failing_guards(env, values_of(env, {"a0": torch.empty(2, 5)}))
    assert not failing_guards(env, values_of(env, {"a0": torch.empty(3, 5)}))


def test_marked_ranges_bound_a_symbol() -> None:
    env = ShapeEnv()
    x = symbolic_meta(
        torch.empty(8, 3), LocalSource("x"), env, dynamic_dims=[0], ranges={0: (4, 64)}
    )
    assert x.shape[1] == 3 and decided(env) == ["L['x'].size()[1] == 3"]
    s0 = x.size(0)
    assert bool(s0 <= 64) and bool(s0 > 3) and len(env.recorded) == 1
    with pytest.raises(ValueError, match="outside the range"):
        symbolic_meta(torch.empty(80), LocalSource("z"), env, ranges={0: (4, 64)})


def test_int_specializes_with_a_guard() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(6, 5)])
    n = int(x.size(0))
    assert n == 6 and type(n) is int
    assert decided(env) == ["L['a0'].size()[0] == 6"]
    # from then on the size is the constant everywhere (the view runs in the mode, as every
    # op on symbolic metas must: torch 2.11's C++ view kernel reads numel() as an int)
    with SymbolicMetaMode():
        flat = x.view(-1)
    assert x.size(0) == 6 and type(flat.size(0)) is torch.SymInt
    assert str(expr_of(flat.size(0))) == f"6*{expr_of(x.shape[1])}"
    assert [i for i in range(x.size(1))] == [0, 1, 2, 3, 4]  # range() takes __index__
    assert "L['a0'].size()[1] == 5" in guard_code(env)


def test_float_and_float_guards() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(6, 5)])
    half = x.size(0) / 4
    assert isinstance(half, torch.SymFloat)
    assert float(half) == 1.5
    assert decided(env) == ["L['a0'].size()[0]/4 == 1.5"]
    assert math.floor(x.size(1) / 2) == 2  # SymFloat -> floor -> a guarded value


def test_arithmetic_on_symints_follows_python() -> None:
    env = ShapeEnv()
    x, y = _metas(env, [(7, 3), (5, 2)])
    a, b = x.size(0), y.size(0)
    cases = [
        (a + 3, 10),
        (a - b, 2),
        (a * b, 35),
        (a // 2, 3),
        (a % b, 2),
        (-a, -7),
        (a**2, 49),
        (torch.sym_max(a, b), 7),
        (torch.sym_min(a, b), 5),
        (torch.sym_int(a / 2), 3),
    ]
    for value, hint in cases:
        assert isinstance(value, torch.SymInt), value
        assert value.node.hint == hint
        assert env.size_hint(expr_of(value)) == hint
    assert isinstance(torch.sym_float(a), torch.SymFloat)
    assert (a == b).node.hint is False
    assert env.recorded == []


def test_symnode_protocol() -> None:
    env = ShapeEnv()
    (x,) = _metas(env, [(7,)])
    node = x.size(0).node
    assert isinstance(node, SymNode)
    assert node.is_int() and not node.is_float() and not node.is_bool() and node.has_hint()
    assert node.maybe_as_int() is None and node.wrap_int(3).maybe_as_int() == 3
    assert node.str() == "s0" and not node.is_nested_int()
    assert node.statically_known_true("", 0) is False
    assert node.ge(node.wrap_int(2)).statically_known_true("", 0) is True
    assert node.sym_sum([node, node.wrap_int(1)]).hint == 8
    assert env.recorded == []


def test_every_decision_form_guards_as_guard_bool_does() -> None:
    # torch's meta kernels ask through torch._check, guard_or_false, guard_size_oblivious,
    # expect_true: every symbol has a hint, so each is a decision with a guard
    env = ShapeEnv()
    (x,) = _metas(env, [(6, 5)])
    node = (x.size(0) > 4).node
    for name in ("expect_true", "guard_size_oblivious", "guard_or_false", "guard_or_true"):
        assert getattr(node, name)("", 0) is True
    torch._check(x.size(1) < 9)
    assert decided(env) == ["L['a0'].size()[0] > 4", "L['a0'].size()[1] < 9"]
    assert node.statically_known_true("", 0) is True  # known now: it is a guard
    values = values_of(env, {"a0": torch.empty(6, 12)})
    (failed,) = failing_guards(env, values)
    assert describe_failure(env, failed, values).startswith(
        f"L['a0'].size()[1] < 9 failed: got 12 (assumed at {__file__}:"
    )


def test_source_kinds_for_sizes_and_strides() -> None:
    t = torch.empty(3, 4)
    assert str(SizeSource(LocalSource("x"), 1)) == "L['x'].size()[1]"
    assert str(StrideSource(LocalSource("x"), 0)) == "L['x'].stride()[0]"
    assert SizeSource(LocalSource("x"), 1).resolve({"x": t}, {}, {}) == 4
    assert StrideSource(LocalSource("x"), 0).resolve({"x": t}, {}, {}) == 4


# -- guards evaluated on new sizes: every relation kind --------------------------------------


def _program(x: torch.Tensor, y: torch.Tensor) -> list[bool]:
    # one decision per relation kind
    return [
        bool(x.size(0) > 8),  # >
        bool(x.size(1) <= 12),  # <=
        bool(x.size(0) % 2 == 0),  # Eq on a Mod
        bool(x.size(1) // 3 != 2),  # Ne on a FloorDiv
        bool(x.size(0) + y.size(0) < 40),  # a sum
        bool(x.size(1) * y.size(1) >= 30),  # a product
    ]


def test_guards_fail_exactly_where_the_decisions_would_differ() -> None:
    env = ShapeEnv(duck_shape=False)
    x, y = _metas(env, [(10, 6), (7, 5)])
    traced = _program(x, y)
    assert len(env.recorded) == len(traced)
    code = guard_code(env)
    local_code = guard_code(
        env, lambda src: str(src).replace("L['a0']", "a0").replace("L['a1']", "a1")
    )
    rng = random.Random(0)
    seen = {True: 0, False: 0}
    for _ in range(300):
        xs = (rng.randint(2, 20), rng.randint(2, 14))
        ys = (rng.randint(2, 24), rng.randint(2, 20))
        frame = {"a0": torch.empty(xs), "a1": torch.empty(ys)}
        holds = not failing_guards(env, values_of(env, frame))
        same = _program(frame["a0"], frame["a1"]) == traced
        assert holds == same, (xs, ys)
        # the printed text agrees with the evaluator, however sources are spelled
        assert all(eval(c, {"L": frame, "math": math}) for c in code) == holds
        assert all(eval(c, {**frame, "math": math}) for c in local_code) == holds
        seen[holds] += 1
    assert seen[True] > 5 and seen[False] > 5


def test_bert_forward_keeps_batch_and_sequence_symbolic() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=100,
    )
    model = transformers.BertModel(config).eval().to("meta")
    env = ShapeEnv()
    ids = symbolic_meta(torch.randint(0, 100, (2, 8)), LocalSource("input_ids"), env)
    with torch.no_grad(), SymbolicMetaMode():
        out = model(input_ids=ids).last_hidden_state
    assert [str(expr_of(d)) for d in out.shape] == ["s0", "s1", "64"]
    # the one decision: the sequence fits the position table
    assert decided(env) == ["L['input_ids'].size()[1] <= 512"]
