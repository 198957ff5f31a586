"""Programs the differential fuzzer (tests/fuzz) found Kiln getting wrong, shrunk by hand.

Each test is differential against eager over a few calls; those marked ``xfail(strict=True)``
are known wrong in a layer the fuzzer does not fix, and start passing (failing the suite) once
that layer is fixed, so the mark is removed with the fix.
"""

from __future__ import annotations

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def test_strided_view_input_requiring_grad():
    f = kiln.compile(lambda y: y.square())
    for rows in (6, 5):
        base = torch.randn(rows, 4, requires_grad=True)
        y = base[:, 2:]  # strides (4, 1): not dense
        out = f(y)
        torch.testing.assert_close(out, y.square())
        (g,) = torch.autograd.grad(out.sum(), base)
        torch.testing.assert_close(g, torch.autograd.grad(y.square().sum(), base)[0])


def _restores_grad_mode(gm, example_inputs):
    """A backend that, like one tracing the graph ahead of time, does not leave the graph's
    ``_set_grad_enabled`` calls in effect once it returns."""

    def run(*args):
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            return gm(*args)

    return run


def _break_inside_no_grad(x):
    with torch.no_grad():
        v = x * 2
        k = v.sum().item()  # a graph break inside the block
        w = v + k
    return w * x, torch.is_grad_enabled()


def _disables_grad(x):
    torch.set_grad_enabled(False)  # left disabled for the caller, as eager does
    return x * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln", _restores_grad_mode])
@pytest.mark.parametrize("fn", [_break_inside_no_grad, _disables_grad])
def test_grad_mode_after_a_graph_is_eagers(fn, backend):
    f = kiln.compile(fn, backend=backend)
    try:
        for dtype in (torch.float32, torch.float32, torch.float64):
            x = torch.randn(3, 4, dtype=dtype, requires_grad=True)
            expected = fn(x)
            mode_eager = torch.is_grad_enabled()
            torch.set_grad_enabled(True)
            out = f(x)
            assert torch.is_grad_enabled() == mode_eager
            torch.set_grad_enabled(True)
            torch.testing.assert_close(out, expected)
            leaves = out if isinstance(out, tuple) else (out,)
            exp = expected if isinstance(expected, tuple) else (expected,)
            assert [getattr(t, "requires_grad", None) for t in leaves] == [
                getattr(t, "requires_grad", None) for t in exp
            ]
    finally:
        torch.set_grad_enabled(True)


def _inference_mode_false(x):
    with torch.inference_mode(False):  # enables grad, even inside no_grad
        v = x * 3 + 1
    return v, torch.is_grad_enabled()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
@pytest.mark.parametrize("caller_grad", [False, True])
def test_inference_mode_false_enables_grad(backend, caller_grad):
    f = kiln.compile(_inference_mode_false, backend=backend)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, 2, dtype=dtype, requires_grad=True)
        with torch.set_grad_enabled(caller_grad):
            expected, out = _inference_mode_false(x), f(x)
        torch.testing.assert_close(out, expected)
        assert out[0].requires_grad == expected[0].requires_grad


@pytest.mark.parametrize(
    "op",
    [
        lambda x: torch.roll(x, 1, 0),
        lambda x: x.flip(0),
        lambda x: (x.flip(0), x.t()),
        lambda x: x.flip(0).t(),
    ],
)
def test_roll_and_flip_over_a_size_one_dim_return_new_tensors(op):
    f = kiln.compile(op)
    x = torch.randn(1, 3)
    before = x.clone()
    out = f(x)
    torch.testing.assert_close(out, op(before))
    (out[0] if isinstance(out, tuple) else out).add_(1)  # the flipped result is its own tensor
    torch.testing.assert_close(x, before)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("op", [lambda x: x[None], lambda x: x.t(), lambda x: (x * 2, x[0])])
def test_view_output_of_an_offset_view_input_requiring_grad(backend, op):
    f = kiln.compile(op, backend=backend)
    base = torch.randn(2, 4, requires_grad=True)
    x = base[1:, 1:-1]  # storage offset 5, strides (4, 1)
    out, expected = f(x), op(x)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_view_output_of_an_input_at_another_storage_offset(backend, requires_grad):
    """Guards match sizes and strides, not offsets: a second call with a view of another
    row of the same storage reuses the entry, and its view output must be of that row."""
    f = kiln.compile(lambda x: (x * 2, x[None], x.t()), backend=backend)
    base = torch.randn(3, 2, 4, requires_grad=requires_grad)
    for row in (0, 2, 1):
        x = base[row]
        torch.testing.assert_close(f(x), (x * 2, x[None], x.t()))
        assert f(x)[1].storage_offset() == x.storage_offset()


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_view_output_made_under_no_grad_has_no_gradient_path(backend):
    f = kiln.compile(lambda y: y[1:], backend=backend)
    base = torch.randn(5, 4, requires_grad=True)
    with torch.no_grad():
        out = f(base)
    assert out.requires_grad and out.grad_fn is None  # as eager's view of a leaf
    assert torch.autograd.grad(out.sum(), base, allow_unused=True)[0] is None


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_view_output_made_in_the_program_s_own_grad_regions(backend):
    def g(y):
        with torch.enable_grad():
            a = y[1:]
        with torch.no_grad():
            b = y[:2]
        return a, b

    f = kiln.compile(g, backend=backend)
    for caller_grad in (False, True, False):
        base = torch.randn(5, 4, requires_grad=True)
        with torch.set_grad_enabled(caller_grad):
            got, want = f(base), g(base)
        for o, e in zip(got, want):
            assert (o.requires_grad, o.grad_fn is None) == (e.requires_grad, e.grad_fn is None)


def _reduced_then_changed_after_a_break(x, y):
    v2 = y.amin(dim=1, keepdim=True)  # Kiln's kernel returns it as a view of the reduced buffer
    v3 = 2 - v2
    if v2.sum() > 0:  # a graph break: v2 is an output of the first graph
        v2.mul_(0.5)
    else:
        v2 = v2 * 0.5
    return torch.atan2(v2, v2), y, v3


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_an_output_changed_in_place_after_a_graph_break(backend):
    f = kiln.compile(_reduced_then_changed_after_a_break, backend=backend)
    for seed, transposed in enumerate((True, True, False)):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 3, generator=gen, requires_grad=True)
        base = torch.randn(3, 4, generator=gen, requires_grad=True)
        y = base.t() if transposed else base.t().contiguous()
        got, expected = f(x, y), _reduced_then_changed_after_a_break(x, y)
        torch.testing.assert_close(got, expected)
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]


def _history_behind_a_dead_value(x, y):
    v0 = torch.logsumexp(y, 1)
    v0[-1] = v0[0]  # changes the result LogsumexpBackward saved
    v1 = y / (2 + 3.5)
    v2 = v0 * 3 + 1
    v2 = v2 + v0.sum().item()  # a graph break: v2 enters the next graph and is not used
    return v1 * y + v1


@pytest.mark.filterwarnings("ignore:kiln. the backend failed")  # the first graph runs eagerly
@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_backward_does_not_walk_into_the_history_of_an_unused_input(backend):
    f = kiln.compile(_history_behind_a_dead_value, backend=backend)
    for shape in ((1, 4), (1, 4), (3, 2)):
        x, y = torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
        got, expected = f(x, y), _history_behind_a_dead_value(x, y)
        torch.testing.assert_close(got, expected)
        (g,) = torch.autograd.grad(got.sum(), y)
        torch.testing.assert_close(g, torch.autograd.grad(expected.sum(), y)[0])


def _saved_then_changed_after_a_break(x, y):
    v0 = x - x
    v1 = v0 / (v0.abs() + 1)  # eager's backward saves v0
    y.max().item()  # a graph break: v0 is an output of the first graph
    v0.mul_(0.5)
    return v1


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize(
    "fn", [_saved_then_changed_after_a_break, _reduced_then_changed_after_a_break]
)
def test_backward_raises_where_a_saved_tensor_was_changed_after_a_break(backend, fn):
    """Eager's backward raises (a tensor it saved was changed in place); so does torch.compile's
    on these programs, and so must Kiln's, whose graphs saved other values."""
    f = kiln.compile(fn, backend=backend)
    for shape in ((1, 3), (1, 3), (4, 1)):
        # positive: the branch that changes v2 in place
        x, y = (torch.rand(shape).add(0.5).requires_grad_() for _ in range(2))
        for run in (fn, f):
            out = run(x, y)
            loss = sum(t.sum() for t in (out if isinstance(out, tuple) else (out,)))
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                torch.autograd.grad(loss, (x, y), allow_unused=True)


def _raises_after_a_block_left_in_a_continuation(x):
    with torch.no_grad():
        k = x.sum().item()  # a graph break inside the block: the rest leaves it
        v = x + k
    return x.max() + v  # max() of an empty tensor raises


def _raises_inside_a_block(x):
    with torch.no_grad():
        m = x.max()
    return m * x


def _raises_inside_a_block_before_a_break(x):
    with torch.no_grad():
        m = x.max()
        k = m.item()
    return x * k


def _raises_after_disabling(x):
    torch.set_grad_enabled(False)  # a bare switch stays in effect, as eager leaves it
    return x.max() * x


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln", _restores_grad_mode])
@pytest.mark.parametrize(
    "fn",
    [
        _raises_after_a_block_left_in_a_continuation,
        _raises_inside_a_block,
        _raises_inside_a_block_before_a_break,
        _raises_after_disabling,
    ],
)
def test_grad_mode_after_a_graph_raises_is_eagers(fn, backend):
    f = kiln.compile(fn, backend=backend)
    try:
        for rows in (2, 0, 3, 0):  # an empty input makes max() raise
            x = torch.randn(rows, 3, requires_grad=True)
            outcomes = []
            for run in (fn, f):
                torch.set_grad_enabled(True)
                try:
                    out = run(x)
                except RuntimeError as e:
                    out = type(e)
                outcomes.append((torch.is_grad_enabled(), out))
            (mode_e, out_e), (mode_k, out_k) = outcomes
            assert mode_k == mode_e, rows
            if isinstance(out_e, torch.Tensor):
                torch.testing.assert_close(out_k, out_e)
            else:
                assert out_k is out_e
    finally:
        torch.set_grad_enabled(True)


def _no_grad_view_of_an_enable_grad_result(x):
    with torch.enable_grad():
        v = x * 3 + 1
    return v.view(-1), x  # made under the caller's no_grad: requires grad, no path back


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_a_view_made_under_no_grad_of_a_result_requiring_grad(backend):
    f = kiln.compile(_no_grad_view_of_an_enable_grad_result, backend=backend)
    for rows in (5, 5, 4):
        x = torch.randn(rows, 1, requires_grad=True)
        with torch.no_grad():
            expected, got = _no_grad_view_of_an_enable_grad_result(x), f(x)
        torch.testing.assert_close(got, expected)
        for g, e in zip(got, expected, strict=True):
            assert (g.requires_grad, g.grad_fn is None, g._is_view()) == (
                e.requires_grad,
                e.grad_fn is None,
                e._is_view(),
            )


def _saved_for_an_unused_output_then_changed(x, y):
    v0 = x + y
    v1 = v0.abs()  # a dead local: an output of the first graph, whose backward reads v0
    v0.max().item()  # a graph break
    v0[-1] = v0[0]  # changes v0 after the graph: eager never runs abs's backward
    return v0


def _saved_result_then_changed(x, y):
    v0 = x * y
    v1 = v0.exp()  # eager's backward saves v1, the result
    v0.max().item()  # a graph break
    v1.mul_(2)
    return v0, v1


def _input_saved_for_one_output(x, y):
    return x * 2, x.abs() + y  # abs's backward reads x; x * 2's does not


def _changes_first_input(args):
    args[0].mul_(2)  # x is not a leaf: eager allows the change


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize(
    ("fn", "loss_on", "after", "raises"),
    [
        (_saved_for_an_unused_output_then_changed, (0,), None, False),
        (_saved_result_then_changed, (0,), None, False),  # exp's node is not reached
        (_saved_result_then_changed, (1,), None, True),  # exp's saved result changed
        (_saved_result_then_changed, (0, 1), None, True),
        (_input_saved_for_one_output, (0,), _changes_first_input, False),
        (_input_saved_for_one_output, (1,), _changes_first_input, True),
        (_input_saved_for_one_output, (0, 1), None, False),
    ],
)
def test_backward_raises_for_a_changed_saved_value_only_where_eager_s_does(
    backend, fn, loss_on, after, raises
):
    """The compiled backward reads values saved for every output; eager's reads those of the
    nodes the loss reaches. A value the user changed in place after the call (an output, an
    input) makes Kiln raise exactly where eager raises, with eager's gradients elsewhere."""
    f = kiln.compile(fn, backend=backend)
    for shape in ((4,), (4,), (2, 3)):
        results = []
        for run in (fn, f):
            gen = torch.Generator().manual_seed(len(shape))
            leaves = [torch.randn(shape, generator=gen, requires_grad=True) for _ in range(2)]
            x, y = leaves[0] * 1, leaves[1]  # x is not a leaf: it may be changed in place
            out = run(x, y)
            if after is not None:
                after((x, y))
            outs = out if isinstance(out, tuple) else (out,)
            loss = sum(outs[i].sum() for i in loss_on)
            if raises:
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    torch.autograd.grad(loss, leaves, allow_unused=True)
                continue
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            results.append([torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)])
        if not raises:
            torch.testing.assert_close(results[1], results[0])


def _two_outputs_one_unbounded_gradient(x):
    v = x * 1
    return v, v.log()  # log's gradient at 0 is infinite


def _split_one_part_unbounded(x):
    a, b = x.split([2, x.shape[0] - 2])  # one backward node takes both parts' gradients
    return a * 2, b.log()


def _var_and_log_mean(x):
    v, m = torch.var_mean(x, dim=0)
    return v, m.log()


def _unbound_rows(x):
    a, b, c = x[:3].unbind(0)
    return a.sin(), b.log(), (c * a).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize(
    "fn",
    [
        _two_outputs_one_unbounded_gradient,
        _split_one_part_unbounded,
        _var_and_log_mean,
        _unbound_rows,
    ],
)
def test_an_output_without_gradient_contributes_nothing(fn, backend):
    """Eager never runs the backward of an output the loss does not use; a zero tangent for it
    would multiply log's infinite gradient at 0 into NaN."""
    f = kiln.compile(fn, backend=backend)
    for rows in (4, 4, 5):
        x = torch.rand(rows, 3)
        x[:, 0] = 0
        x[-1] = 0
        x.requires_grad_()
        expected, got = fn(x), f(x)
        for loss_on in [(i,) for i in range(len(expected))] + [tuple(range(len(expected)))]:
            grads = [
                torch.autograd.grad(sum(outs[i].sum() for i in loss_on), x, retain_graph=True)[0]
                for outs in (got, expected)
            ]
            torch.testing.assert_close(grads[0], grads[1], equal_nan=True)


def _unused_max_over_rows(x):
    x.max(dim=0)  # result unused: a graph would drop it
    return x * 2


def _max_over_rows(x):
    return x.amax(0), x.argmin(0), x.max(dim=0).values


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
@pytest.mark.parametrize("fn", [_unused_max_over_rows, _max_over_rows])
def test_a_reduction_over_zero_elements_raises_as_eager_s_does(fn, backend):
    """max/min and their kin have no value over zero elements: eager raises, even where the
    result is unused, while their meta kernels let the empty input through."""
    f = kiln.compile(fn, backend=backend)
    x = torch.randn(2, 3)
    torch.testing.assert_close(f(x), fn(x))
    for _ in range(2):
        with pytest.raises(IndexError, match="non-zero size"):
            fn(torch.randn(0, 3))
        with pytest.raises(IndexError, match="non-zero size"):
            f(torch.randn(0, 3))
    # reduced over a dim that has elements, an empty input has an (empty) answer
    x = torch.randn(3, 0)
    torch.testing.assert_close(f(x), fn(x))


def _minus_a_bool(x):
    k = bool(x.max().item() > 0.25)  # a graph break: k is a Python bool after it
    unused = x - k  # noqa: F841  eager raises even though the result is unused
    return x * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_minus_with_a_bool_raises_as_eager_s_does(backend):
    """``-`` with a bool tensor or a Python bool: eager's kernels refuse it, the meta kernel
    does not, and a graph dropped the unused result where eager raises."""
    f = kiln.compile(_minus_a_bool, backend=backend)
    for _ in range(2):
        x = torch.rand(4) + 0.5
        # NotImplementedError from torch 2.14, RuntimeError before
        with pytest.raises((NotImplementedError, RuntimeError), match="bool") as eager:
            _minus_a_bool(x)
        with pytest.raises(eager.type, match="bool"):
            f(x)


def _doubled_under_no_grad_then_used(y, z):
    with torch.no_grad():
        y.mul_(2)
    return y * z


def _written_through_a_view_then_grad_enabled(y, z):
    with torch.no_grad():
        v = y.t().contiguous().view(y.shape[1], -1)  # a view of y when y.t() is contiguous
        v += v
    with torch.inference_mode(False):  # enables grad, even inside no_grad
        w = y * 3 + z
    return w, y


def _written_twice_then_returned(y, z):
    with torch.no_grad():
        y.add_(1)
        y.mul_(z)
    return y.sin(), z


def _view_input(kind):
    torch.manual_seed(0)
    if kind == "transposed":
        base = torch.randn(5, 1, requires_grad=True)
        return base, base.t()
    if kind == "sliced":
        base = torch.randn(2, 7, requires_grad=True)
        return base, base[1:, 1:-1]
    base = torch.randn(1, 5, requires_grad=True)
    return base, (base * 1).view(1, 5)  # a view of a non-leaf


def _grads(out, y, base):
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if t.requires_grad]
    if not leaves:
        return None
    loss = sum((t * (k + 1)).sum() for k, t in enumerate(leaves))
    return torch.autograd.grad(loss, [y, base], allow_unused=True)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
@pytest.mark.parametrize("caller", [torch.enable_grad, torch.no_grad])
@pytest.mark.parametrize("kind", ["transposed", "sliced", "of_non_leaf"])
@pytest.mark.parametrize(
    "fn",
    [
        _doubled_under_no_grad_then_used,
        _written_through_a_view_then_grad_enabled,
        _written_twice_then_returned,
    ],
)
def test_a_view_input_written_under_no_grad_keeps_its_gradient(fn, kind, caller, backend):
    """The node of a compiled call takes a view input whose write autograd does not see:
    eager's write regenerates the view's ``grad_fn`` before the ops after it use it, so
    ``grad(out, view)`` reaches them, and Kiln's must too."""
    compiled = kiln.compile(fn, backend=backend)
    for step in range(3):
        results = []
        for f in (fn, compiled):
            base, y = _view_input(kind)
            z = torch.randn(1, 5) + step
            with caller():
                out = f(y, z)
            results.append((out, y.detach().clone(), _grads(out, y, base)))
        (out_e, y_e, grads_e), (out_k, y_k, grads_k) = results
        torch.testing.assert_close(out_k, out_e)
        torch.testing.assert_close(y_k, y_e)
        if grads_e is None:
            assert grads_k is None
            continue
        assert [g is None for g in grads_k] == [g is None for g in grads_e]
        for g_k, g_e in zip(grads_k, grads_e):
            if g_e is not None:
                torch.testing.assert_close(g_k, g_e)


def _saves_a_view_then_writes_its_base(y):
    out = y.t().sin()  # sin's backward reads the view of y: eager's raises
    with torch.no_grad():
        y.mul_(2)
    return out


def _saves_a_result_then_writes_the_input(y):
    out = y.t().exp()  # exp's backward reads its result: eager's does not raise
    with torch.no_grad():
        y.mul_(2)
    return out


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize(
    "fn", [_saves_a_view_then_writes_its_base, _saves_a_result_then_writes_the_input]
)
def test_a_value_saved_before_an_input_is_written_under_no_grad(fn, backend):
    """The write-back of a view input written under ``no_grad`` makes no version bump of its
    own: a value saved before the write still fails autograd's check in the backward where
    eager's does, and nothing else does."""
    compiled = kiln.compile(fn, backend=backend)
    grads = []
    for f in (fn, compiled):
        torch.manual_seed(0)
        base = torch.randn(3, 4, requires_grad=True)
        out = f(base[1:])
        try:
            grads.append(torch.autograd.grad(out.sum(), base)[0])
        except RuntimeError as e:
            assert "modified by an inplace operation" in str(e)
            grads.append(None)
    if fn is _saves_a_view_then_writes_its_base:
        assert grads == [None, None]
    else:
        torch.testing.assert_close(grads[1], grads[0])


def _add_a_shifted_slice(x):
    x[:4].add_(x[2:6])
    return x * 2


def _copy_its_own_unsqueezed_view(x):
    x.unsqueeze(0).copy_(x)  # one range of memory, laid out apart: eager refuses it
    return x + 1


def _copy_its_transpose(x):
    m = x[:8].view(4, 2)[:2]
    m.copy_(m.t())
    return x.sum()


def _add_into_an_expanded_tensor(x):
    e = x[:1].expand(3)
    e.add_(1)
    return x


def _where_into_an_overlapping_out(x):
    torch.where(x[2:6] > 0, x[2:6], x[1:5], out=x[:4])
    return x


def _allowed_overlaps(x):
    x.mul_(x)  # the same tensor
    x[:4].add_(x[::2][:4])  # one of them not dense: too hard to tell, eager lets it through
    x[:1].expand(3).fill_(2.0)  # fill_ does not check
    x[:4].masked_fill_(x[2:6] > 1, 0.5)  # nor does masked_fill_
    return x.sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
@pytest.mark.parametrize(
    "fn",
    [
        _add_a_shifted_slice,
        _copy_its_own_unsqueezed_view,
        _copy_its_transpose,
        _add_into_an_expanded_tensor,
        _where_into_an_overlapping_out,
        _allowed_overlaps,
    ],
)
def test_writes_over_overlapping_memory_raise_where_eager_s_do(fn, backend):
    """Eager's kernels refuse a write whose memory overlaps its inputs' (or its own); the meta
    kernels do not look, so capture checks as TensorIterator does, and lets through what it
    lets through."""
    compiled = kiln.compile(fn, backend=backend)
    for n in (8, 10, 8):
        results = []
        for f in (fn, compiled):
            torch.manual_seed(n)
            x = torch.randn(n)
            try:
                results.append((f(x), x))
            except RuntimeError as e:
                results.append((str(e), None))
        (out_e, x_e), (out_k, x_k) = results
        if x_e is None:
            assert out_k == out_e
            assert "memory location" in out_e
        else:
            torch.testing.assert_close(out_k, out_e)
            torch.testing.assert_close(x_k, x_e)


def _doubles_itself_with_grad(v):
    with torch.enable_grad():
        v += v
    return v


def _scales_itself_then_uses_it(v):
    with torch.enable_grad():
        v.mul_(3)
        w = v.sin()
    return v, w


def _doubles_after_a_break_in_no_grad(x):
    v = x.mean(0)
    with torch.no_grad():
        k = x.sum().item()  # a graph break: the rest resumes inside the block
    v += v
    return v * k


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize(
    ("fn", "caller"),
    [
        (_doubles_itself_with_grad, torch.no_grad),
        (_scales_itself_then_uses_it, torch.no_grad),
        (_doubles_after_a_break_in_no_grad, torch.enable_grad),
    ],
)
def test_an_input_written_with_grad_inside_a_no_grad_call(fn, caller, backend):
    """A program called under ``no_grad`` that enables grad itself is traced twice (the first
    trace tells it needs a backward); each trace gets fresh fakes, or the second one's
    backward runs through the first one's writes too (the gradient doubled)."""
    compiled = kiln.compile(fn, backend=backend)
    for step in range(3):
        grads = []
        for f in (fn, compiled):
            torch.manual_seed(step)
            x = torch.randn(3, 2, requires_grad=True)
            arg = x if fn is _doubles_after_a_break_in_no_grad else x * 1
            with caller():
                out = f(arg)
            leaves = [t for t in torch.utils._pytree.tree_leaves(out) if t.requires_grad]
            grads.append(torch.autograd.grad(sum(t.sum() for t in leaves), x)[0])
        torch.testing.assert_close(grads[1], grads[0])


def _copy_into_a_view_made_before_a_break(x, y):
    v = y.unsqueeze(0)
    if (y > 0.5).any():  # a graph break: v and y are two inputs of the next graph
        x = x - 1
    v.copy_(y)
    return x + v


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_an_overlapping_write_between_two_inputs_raises_where_eager_s_does(backend):
    """Two inputs of one graph sharing memory get separate fakes in capture (guards do not
    check aliasing); the backend's trace over their common base checks the write."""
    fn = _copy_into_a_view_made_before_a_break
    compiled = kiln.compile(fn, backend=backend)
    for shape, same in (((3, 1), False), ((2, 4), True), ((2, 4), False)):
        messages = []
        for f in (fn, compiled):
            torch.manual_seed(0)
            y = torch.randn(shape)
            x = y if same else torch.randn(shape)
            try:
                f(x, y)
                messages.append(None)
            except RuntimeError as e:
                messages.append(str(e))
        assert messages[1] == messages[0]


def _saves_a_value_that_crosses_a_break_then_changes_it(x):
    v = x * 1.5
    w = v.square()  # saves v for its backward
    if w.sum() > 0:  # a graph break: v is an output of the first graph
        v.mul_(0.5)
    return torch.exp(w.clamp(-3, 3))


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_saved_output_changed_after_a_break_fails_the_backward(backend):
    """The node checks the outputs eager's autograd saved (found by walking the trace's
    autograd graph, whose nodes' Python objects must stay alive while their ids are keys)."""
    fn = _saves_a_value_that_crosses_a_break_then_changes_it
    compiled = kiln.compile(fn, backend=backend)
    for f in (fn, compiled, compiled):
        out = f(torch.randn(3, 3, requires_grad=True))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def _row_of_no_grad_scaled(x, y):
    with torch.no_grad():
        y = y * 0.5
    return x @ y[0]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_a_saved_view_keeps_the_strides_the_backward_was_traced_with(backend):
    """``y[0]`` of a transposed ``y`` steps by 5; the default backend kept it as a row of its
    own contiguous buffer (step 1), and the backward, traced with step 5, read other values."""
    f = kiln.compile(_row_of_no_grad_scaled, backend=backend)
    x = torch.randn(5, 5).t().requires_grad_()
    y = torch.randn(5, 5).t().requires_grad_()
    (got,) = torch.autograd.grad(f(x, y).sum(), x)
    (want,) = torch.autograd.grad(_row_of_no_grad_scaled(x, y).sum(), x)
    torch.testing.assert_close(got, want)
