"""The env's memo of symbolic op runs (``kiln.capture.shapes.memo``) and of the expressions
arithmetic on symbolic values builds: a repeat gives what running the op again gives (sizes,
strides, offset, dtype, aliasing, view-ness, guards), and the key tells apart what must be."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sympy
import torch

from kiln.capture.shapes import ShapeEnv, expr_of, memo, run_symbolic, symbolic_meta
from kiln.capture.source import LocalSource

aten = torch.ops.aten


@pytest.fixture
def memo_off() -> Iterator[None]:
    memo.enabled[0] = False
    try:
        yield
    finally:
        memo.enabled[0] = True


def _meta(env: ShapeEnv, shape: tuple[int, ...], name: str, **kw: Any) -> torch.Tensor:
    return symbolic_meta(torch.empty(*shape, **kw), LocalSource(name), env)


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    exprs = [str(expr_of(s)) for s in (*t.shape, *t.stride(), t.storage_offset())]
    nbytes = str(expr_of(t.untyped_storage().nbytes()))
    return (*exprs, nbytes, t.dtype, t._is_view())


def _ops(
    x: torch.Tensor, w: torch.Tensor, z: torch.Tensor
) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    n = x.shape[0] * x.shape[1]
    heads = run_symbolic(aten.view.default, (x, [x.shape[0], x.shape[1], 2, 4]), {})
    q = run_symbolic(aten.transpose.int, (heads, 1, 2), {})
    return [
        (aten.add.Tensor, (x, x), {}),
        (aten.mul.Scalar, (x, 2.5), {}),
        (aten.view.default, (x, [n, 8]), {}),
        (aten.transpose.int, (x, 0, 1), {}),
        (aten.slice.Tensor, (x, 1, 1, x.shape[1]), {}),
        (aten.expand.default, (w, [x.shape[0], 8, 8]), {}),
        (aten.native_layer_norm.default, (x, [8], None, None, 1e-5), {}),
        (aten.var_mean.correction, (x, [2]), {"keepdim": True}),
        (aten.split.Tensor, (x, 3, 1), {}),
        (aten.clone.default, (z,), {"memory_format": torch.channels_last}),
        (aten.clone.default, (x.transpose(0, 2),), {}),
        # a permuted fresh output and a view of a fresh tensor (the transposed logsumexp)
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q), {}),
    ]


def _run_all(env: ShapeEnv, repeats: int) -> list[Any]:
    x = _meta(env, (4, 6, 8), "x")
    w = _meta(env, (8, 8), "w")
    z = _meta(env, (2, 3, 4, 5), "z")
    seen = []
    for _ in range(repeats):
        for func, args, kwargs in _ops(x, w, z):
            out = run_symbolic(func, args, kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            for r in outs:
                same = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and r is a]
                shares = [
                    i
                    for i, a in enumerate(args)
                    if isinstance(a, torch.Tensor)
                    and a.untyped_storage()._cdata == r.untyped_storage()._cdata
                ]
                seen.append((str(func), type(out).__name__, _layout(r), same, shares))
    return seen


def test_a_repeat_gives_what_running_the_op_again_gives(memo_off: None) -> None:
    without = ShapeEnv()
    expected = _run_all(without, 2)
    memo.enabled[0] = True
    env = ShapeEnv()
    assert _run_all(env, 2) == expected
    assert env.op_results, "the repeats were not served from the memo"
    assert set(map(str, env.guards)) == set(map(str, without.guards))


def test_a_repeat_is_served_without_running_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.capture.shapes import dispatch

    env = ShapeEnv()
    x = _meta(env, (4, 6, 8), "x")
    first = run_symbolic(aten.add.Tensor, (x, x), {})
    calls: list[Any] = []
    monkeypatch.setattr(dispatch, "_run_python", lambda *a: calls.append(a))
    again = run_symbolic(aten.add.Tensor, (x, x), {})
    assert not calls
    assert again is not first and _layout(again) == _layout(first)
    assert again.untyped_storage()._cdata != first.untyped_storage()._cdata  # fresh storage


def test_the_key_tells_apart_dtypes_scalars_and_layouts() -> None:
    env = ShapeEnv()
    x = _meta(env, (4, 6, 8), "x")
    h = _meta(env, (4, 6, 8), "h", dtype=torch.float16)
    t = x.transpose(1, 2)
    assert run_symbolic(aten.add.Tensor, (x, h), {}).dtype == torch.float32
    assert run_symbolic(aten.add.Tensor, (h, h), {}).dtype == torch.float16
    assert run_symbolic(aten.mul.Tensor, (h, 2), {}).dtype == torch.float16
    assert run_symbolic(aten.mul.Tensor, (h, True), {}).dtype == torch.float16
    # the same op on a transposed layout keeps that layout, as eager does
    assert [str(expr_of(s)) for s in run_symbolic(aten.neg.default, (x,), {}).stride()] == [
        str(expr_of(s)) for s in x.stride()
    ]
    assert [str(expr_of(s)) for s in run_symbolic(aten.neg.default, (t,), {}).stride()] == [
        str(expr_of(s)) for s in t.stride()
    ]
    # a view on another argument is a view of that argument
    y = _meta(env, (4, 6, 8), "y")
    n = x.shape[0] * x.shape[1]
    vx = run_symbolic(aten.view.default, (x, [n, 8]), {})
    vy = run_symbolic(aten.view.default, (y, [n, 8]), {})
    assert vy.untyped_storage()._cdata == y.untyped_storage()._cdata
    assert vx.untyped_storage()._cdata == x.untyped_storage()._cdata


def test_ops_that_mutate_or_make_data_dependent_sizes_are_not_memoized() -> None:
    assert not memo._memoizable(aten.add_.Tensor)
    assert not memo._memoizable(aten.transpose_.default)
    assert not memo._memoizable(aten.nonzero.default)
    assert memo._memoizable(aten.bernoulli.default)  # meta tensors draw nothing
    assert not memo._memoizable(aten.sym_size.int)
    assert memo._memoizable(aten.view.default)
    assert memo._memoizable(aten.add.Tensor)
    assert memo._memoizable(aten.split.Tensor)  # a list of views
    env = ShapeEnv()
    x = _meta(env, (4, 6, 8), "x")
    run_symbolic(aten.add_.Tensor, (x, x), {})
    assert not env.op_results


def test_envs_keep_their_own_memos() -> None:
    a, b = ShapeEnv(), ShapeEnv()
    xa, xb = _meta(a, (4, 6, 8), "x"), _meta(b, (4, 6, 8), "x")
    ra = run_symbolic(aten.add.Tensor, (xa, xa), {})
    rb = run_symbolic(aten.add.Tensor, (xb, xb), {})
    assert a.op_results and b.op_results
    assert ra.shape[0].node.env is a and rb.shape[0].node.env is b


def test_arithmetic_results_are_kept_by_operand_types() -> None:
    env = ShapeEnv()
    x = _meta(env, (4, 6), "x")
    s = x.shape[0]
    assert expr_of(s + 2) is expr_of(s + 2)  # built once
    assert expr_of(s * 2.0).has(sympy.Float) and not expr_of(s * 2).has(sympy.Float)
    assert isinstance(s * 2.0, torch.SymFloat) and isinstance(s * 2, torch.SymInt)
    assert (s * 2).node.hint == 8 and (s * 2.0).node.hint == 8.0


def test_a_view_of_one_of_two_arguments_on_one_storage_is_not_memoized() -> None:
    env = ShapeEnv()
    x = _meta(env, (4, 6, 8), "x")
    # views made through the env (torch 2.11's meta kernels take no symbolic sizes directly)
    alias = run_symbolic(aten.view.default, (x, list(x.shape)), {})
    viewed = run_symbolic(aten.view.default, (x, [x.shape[0] * x.shape[1], 8]), {})
    assert env.op_results
    env.op_results.clear()
    memo.remember(memo._lookup_key(aten.add.Tensor, (x, alias), {}), (x, alias), {}, viewed)
    assert not env.op_results


def _run_static(repeats: int) -> list[Any]:
    x = torch.empty(4, 6, 8, device="meta")
    w = torch.empty(8, 8, device="meta")
    z = torch.empty(2, 3, 4, 5, device="meta")
    seen = []
    for _ in range(repeats):
        for func, args, kwargs in _ops(x, w, z):
            out = run_symbolic(func, args, kwargs)
            for r in list(out) if isinstance(out, (tuple, list)) else [out]:
                layout = (r.shape, r.stride(), r.storage_offset(), r.dtype, r._is_view())
                storage = r.untyped_storage()
                shares = [
                    i
                    for i, a in enumerate(args)
                    if isinstance(a, torch.Tensor) and a.untyped_storage()._cdata == storage._cdata
                ]
                seen.append((str(func), type(out).__name__, layout, storage.nbytes(), shares))
    return seen


def test_static_runs_are_kept_process_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most meta kernels are Python for static sizes too: a repeat on the same metadata is
    made from the memo, as the op would make it."""
    memo._STATIC.clear()
    memo.enabled[0] = False
    try:
        expected = _run_static(2)
    finally:
        memo.enabled[0] = True
    assert not memo._STATIC
    assert _run_static(2) == expected
    assert memo._STATIC, "the repeats were not served from the memo"
    op, args = aten.native_layer_norm.default, (torch.empty(4, 6, 8, device="meta"), [8])
    first = run_symbolic(op, (*args, None, None, 1e-5), {})
    again, token = memo.recall(op, (*args, None, None, 1e-5), {})  # made, not run
    assert token is None and [t.stride() for t in again] == [t.stride() for t in first]
    monkeypatch.setattr(memo, "_STATIC_LIMIT", len(memo._STATIC))
    run_symbolic(aten.neg.default, (torch.empty(3, 5, device="meta"),), {})
    assert len(memo._STATIC) == 1  # a full table starts again


def test_arguments_that_require_grad_are_keyed_only_without_grad_mode() -> None:
    """Under ``no_grad`` an op's result is the same whether its arguments require grad or not
    (a model's parameters do; inference runs them without grad mode), so the memo serves it.
    With grad mode on the result would carry autograd history, which a remade tensor lacks."""
    env = ShapeEnv()
    x = _meta(env, (4, 6, 8), "x")
    w = torch.empty(8, 8, device="meta", requires_grad=True)
    b = torch.empty(8, device="meta", requires_grad=True)
    flat = run_symbolic(aten.view.default, (x, [-1, 8]), {})
    op, args = aten.addmm.default, (b, flat, w)
    with torch.no_grad():
        first = run_symbolic(op, args, {})
        again, token = memo.recall(op, args, {})
    assert token is None and again is not None and _layout(again) == _layout(first)
    assert not again.requires_grad
    with torch.enable_grad():
        assert memo.recall(op, args, {}) == (None, None)
        assert run_symbolic(op, args, {}).requires_grad
