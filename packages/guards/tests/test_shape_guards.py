"""Dynamic shapes in checks: TENSOR_MATCH with symbolic sizes (None entries, ``dense_order``)
and the SHAPE guard's relations, built from a real ShapeEnv as capture fills it.

Each failing case also asserts that ``failure_reason`` agrees with the generated function.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import sympy
import torch

from kiln import guards
from kiln.capture.guard_data import GuardKind, GuardSpec, TensorMeta, dense_in_order
from kiln.capture.shapes import ShapeEnv, expr_of, symbolic_meta
from kiln.capture.source import ItemSource, LocalSource, Source


def symbolic_tensor_meta(fake: torch.Tensor, real: torch.Tensor) -> TensorMeta:
    """What capture records for a dense input traced with symbolic sizes: the symbolic
    sizes None, the strides None and the real tensor's dense order, innermost first."""
    sizes = tuple(n if isinstance(n, int) else None for n in fake.shape)
    order = tuple(sorted(range(real.dim()), key=lambda d: (real.stride(d), real.size(d))))
    return TensorMeta(
        type(real),
        real.dtype,
        real.device,
        real.requires_grad,
        sizes,
        (None,) * real.dim(),
        dense_order=order,
    )


def pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x


def traced_env() -> tuple[ShapeEnv, list[GuardSpec]]:
    """x (20, 8) and y (8, 1, 12): y's dim 0 duck-sized to x's dim 1, y's dim 1 specialized
    to 1, and decisions ``x.size(0) > 16`` and ``x.size(1) % 4 == 0``."""
    env = ShapeEnv()
    real_x, real_y = torch.empty(20, 8), torch.empty(8, 1, 12)
    x = symbolic_meta(real_x, LocalSource("x"), env)
    y = symbolic_meta(real_y, LocalSource("y"), env)
    assert bool(x.size(0) > 16)
    assert bool(x.size(1) % 4 == 0)
    specs = [
        GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, symbolic_tensor_meta(x, real_x)),
        GuardSpec(LocalSource("y"), GuardKind.TENSOR_MATCH, symbolic_tensor_meta(y, real_y)),
        GuardSpec(None, GuardKind.SHAPE, env),
    ]
    return env, specs


def assert_passes(check: guards.GuardCheck, *args: Any) -> None:
    assert check.failure_reason(*args) is None
    assert check(*args) is True


def assert_fails(check: guards.GuardCheck, reason_part: str, *args: Any) -> None:
    reason = check.failure_reason(*args)
    assert check(*args) is False
    assert reason is not None and reason_part in reason, reason


@pytest.fixture
def check() -> guards.GuardCheck:
    return guards.build_check(traced_env()[1], pair)


def test_the_check_reads_sizes_from_the_tensor_conditions(check: guards.GuardCheck) -> None:
    # one test for the tensors, then one for the relations over the shapes they kept
    assert check.source.count("if not (") == 2
    assert "len((___shape0 := x.shape)) == 2" in check.source
    assert "___shape0[0] > 16" in check.source
    assert "x.shape[" not in check.source and ".size()" not in check.source
    assert [g.kind for g in check.guards][-1] is GuardKind.SHAPE


@pytest.mark.parametrize(
    ("x", "y"),
    [((20, 8), (8, 1, 12)), ((21, 12), (12, 1, 3)), ((17, 4), (4, 1, 2)), ((1000, 64), (64, 1, 7))],
)
def test_admitted_sizes_pass(
    check: guards.GuardCheck, x: tuple[int, ...], y: tuple[int, ...]
) -> None:
    assert_passes(check, torch.empty(x), torch.empty(y))


@pytest.mark.parametrize(
    ("x", "y", "reason"),
    [
        # duck sizing: y's dim 0 was x's dim 1
        ((20, 8), (7, 1, 12), "L['x'].size()[1] == L['y'].size()[0] failed"),
        ((16, 8), (8, 1, 12), "L['x'].size()[0] > 16 failed: got 16"),  # a bound
        ((20, 6), (6, 1, 12), "(L['x'].size()[1] % 4) == 0 failed: got 6"),  # divisibility
        ((20, 8), (8, 1, 1), "L['y'].size()[2] >= 2 failed: got 1"),  # a symbol's range
        # a specialized size is static in the tensor's meta too: the tensor says it first
        ((20, 8), (8, 2, 12), "tensor L['y'] size mismatch at index 1: expected 1, got 2"),
    ],
)
def test_each_violated_relation_fails(
    check: guards.GuardCheck, x: tuple[int, ...], y: tuple[int, ...], reason: str
) -> None:
    assert_fails(check, reason, torch.empty(x), torch.empty(y))


def test_a_specialization_fails_through_the_shape_guard_alone() -> None:
    env, specs = traced_env()
    loose = dict(specs[1].expected.__dict__, sizes=(None, None, None))
    specs[1] = GuardSpec(LocalSource("y"), GuardKind.TENSOR_MATCH, TensorMeta(**loose))
    check = guards.build_check(specs, pair)
    assert_passes(check, torch.empty(20, 8), torch.empty(8, 1, 12))
    assert_fails(
        check, "L['y'].size()[1] == 1 failed: got 2", torch.empty(20, 8), torch.empty(8, 2, 12)
    )


def test_layouts_that_are_not_dense_in_the_traced_order_fail(check: guards.GuardCheck) -> None:
    y = torch.empty(8, 1, 12)
    gaps = torch.empty(20, 16)[:, ::2]
    assert_fails(check, "tensor L['x'] layout mismatch", gaps, y)
    transposed = torch.empty(8, 20).t()  # sizes (20, 8), dims in the other order
    assert_fails(check, "dims (1, 0) innermost first, got strides (1, 20)", transposed, y)
    # a dim of size 1 may have any stride
    odd_one = torch.empty(96).as_strided((8, 1, 12), (12, 5, 1))
    assert_passes(check, torch.empty(20, 8), odd_one)


def test_wrong_rank_fails_without_raising(check: guards.GuardCheck) -> None:
    y = torch.empty(8, 1, 12)
    assert_fails(check, "tensor L['x'] rank mismatch: expected 2, got 1", torch.empty(20), y)
    assert_fails(check, "tensor L['x'] rank mismatch: expected 2, got 3", torch.empty(20, 8, 2), y)
    assert_fails(check, "L['y'] is not a tensor", torch.empty(20, 8), 3)


def test_relations_alone_fail_on_a_wrong_rank_without_raising() -> None:
    env, specs = traced_env()
    check = guards.build_check([specs[2]], pair)
    assert_passes(check, torch.empty(20, 8), torch.empty(8, 1, 12))
    assert_fails(check, "could not read L['x'].size()[1]: IndexError", torch.empty(20), 3)


def test_relations_read_sources_the_way_the_check_does() -> None:
    """A tensor inside a list is read through the local its condition hoisted; the relations
    read the shape that condition kept."""
    env = ShapeEnv()
    real = torch.empty(6, 20)
    source: Source = ItemSource(LocalSource("xs"), 0)
    fake = symbolic_meta(real, source, env)
    assert bool(fake.size(1) > 16)
    specs = [
        GuardSpec(source, GuardKind.TENSOR_MATCH, symbolic_tensor_meta(fake, real)),
        GuardSpec(None, GuardKind.SHAPE, env),
    ]
    check = guards.build_check(specs, lambda xs: xs)
    assert_passes(check, [torch.empty(3, 17)])
    assert_fails(check, "L['xs'][0].size()[1] > 16 failed: got 9", [torch.empty(3, 9)])
    assert_fails(check, "rank mismatch", [torch.empty(3)])


def test_stride_relations_read_strides_the_check_reads() -> None:
    """A non-dense input keeps constant strides, guarded through its stride sources; with the
    meta leaving every stride to the relations, they read the strides themselves."""
    env = ShapeEnv()
    real = torch.empty(6, 20)[:, ::2]
    fake = symbolic_meta(real, LocalSource("u"), env)
    meta = TensorMeta(torch.Tensor, real.dtype, real.device, False, (None, None), (None, None))
    specs = [
        GuardSpec(LocalSource("u"), GuardKind.TENSOR_MATCH, meta),
        GuardSpec(None, GuardKind.SHAPE, env),
    ]
    assert isinstance(fake.stride(0), int)
    check = guards.build_check(specs, lambda u: u)
    assert "u.stride(0) == 20" in check.source
    assert_passes(check, torch.empty(3, 20)[:, ::2])
    assert_fails(check, "L['u'].stride()[0] == 20 failed: got 10", torch.empty(3, 10))


def test_an_empty_environment_adds_nothing() -> None:
    real = torch.empty(4, 5)
    meta = symbolic_tensor_meta(torch.empty(4, 5), real)  # static sizes, dense strides
    specs = [
        GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, meta),
        GuardSpec(None, GuardKind.SHAPE, ShapeEnv()),
    ]
    check = guards.build_check(specs, lambda x: x)
    assert check.source.count("if not (") == 1
    assert_passes(check, torch.empty(4, 5))
    assert_fails(check, "size mismatch at index 0: expected 4, got 3", torch.empty(3, 5))


def test_static_metas_keep_the_whole_tuple_comparison() -> None:
    real = torch.empty(4, 5)
    spec = GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, TensorMeta.of(real))
    source = guards.build_check([spec], lambda x: x).source
    assert "x.shape == (4, 5) and x.stride() == (5, 1)" in source


def test_floor_and_ceil_find_math_in_scope() -> None:
    env = ShapeEnv()
    x = symbolic_meta(torch.empty(10), LocalSource("x"), env)
    assert env.evaluate_expr(sympy.Eq(sympy.ceiling(expr_of(x.shape[0]) / 4), 3)) is True
    specs = [
        GuardSpec(
            LocalSource("x"), GuardKind.TENSOR_MATCH, symbolic_tensor_meta(x, torch.empty(10))
        ),
        GuardSpec(None, GuardKind.SHAPE, env),
    ]
    check = guards.build_check(specs, lambda x: x)
    assert "math.ceil(" in check.source
    assert_passes(check, torch.empty(9))
    assert_passes(check, torch.empty(12))
    assert_fails(check, "math.ceil(L['x'].size()[0]/4) == 3 failed: got 13", torch.empty(13))
    # the check's own name or a parameter named ``math`` would hide the module: refused
    with pytest.raises(guards.UnsupportedGuard, match="'math'"):
        guards.build_check(specs, lambda x, math=None: x)


def _layout(rng: random.Random) -> torch.Tensor:
    """A tensor of random rank, sizes (0, 1 or more) and dim order, with a gap in one dim
    or one dim broadcast (stride 0, as ``expand`` makes) at times."""
    rank = rng.randint(1, 4)
    sizes = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rank)]
    gap = rng.randrange(rank) if rng.random() < 0.3 else None
    perm = list(range(rank))
    rng.shuffle(perm)
    full = [n * 2 if d == gap else n for d, n in enumerate(sizes)]
    t = torch.empty([full[p] for p in perm]).permute(*[perm.index(d) for d in range(rank)])
    t = t if gap is None else t.narrow(gap, 0, sizes[gap])
    if rng.random() < 0.25 and t.numel():
        d = rng.randrange(rank)
        t = t.narrow(d, 0, 1).expand(*[3 if i == d else -1 for i in range(rank)])
    return t


def test_the_inline_dense_test_is_dense_in_order() -> None:
    """The generated layout test agrees with ``dense_in_order`` on random layouts, with
    symbolic, static, size-1 and broadcast dims in the meta."""
    rng = random.Random(0)
    for _ in range(400):
        traced, now = _layout(rng), _layout(rng)
        order = tuple(sorted(range(traced.dim()), key=lambda d: (traced.stride(d), traced.size(d))))
        sizes = tuple(n if rng.random() < 0.3 else None for n in traced.shape)
        # capture keeps the strides that stay static (the innermost 1) beside the order
        strides = tuple(s if rng.random() < 0.3 else None for s in traced.stride())
        meta = TensorMeta(
            torch.Tensor, now.dtype, now.device, False, sizes, strides, dense_order=order
        )
        check = guards.build_check(
            [GuardSpec(LocalSource("x"), GuardKind.TENSOR_MATCH, meta)], lambda x: x
        )
        expected = (
            now.dim() == len(sizes)
            and all(n is None or n == m for n, m in zip(sizes, now.shape, strict=True))
            and all(n is None or n == m for n, m in zip(strides, now.stride(), strict=True))
            and dense_in_order(now, order, {d for d, s in enumerate(strides) if s == 0})
        )
        assert check(now) is expected, (sizes, order, now.shape, now.stride(), check.source)
        assert (check.failure_reason(now) is None) is expected
