"""Tensor subclass inputs in one graph, against eager.

A ``__torch_function__`` subclass (an override that counts and rescales, or ``Tensor``'s own,
which makes ops return the subclass) is traced through its override into plain ops; results
eager returns as the subclass are rewrapped. A ``__torch_dispatch__`` wrapper subclass with the
flatten protocol (a tensor holding data and a scale) is desugared at the ATen level by
autograd_aot, nested ones too (a scaled tensor around a logging or another scaled tensor, and
the reverse) down to their innermost plain tensors. Each program runs with ``fullgraph=True``
several times on fresh inputs with each backend and must give eager's values, types and
gradients from one graph (and, desugared, from the traced program, not the captured graph); a
plain tensor after a subclass one recompiles.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_map, tree_map_only

import kiln

BACKENDS = ["eager", "aot_eager", "kiln"]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    kiln.reset()
    yield
    kiln.reset()


class Counted(torch.Tensor):
    """A ``__torch_function__`` subclass: doubles ``mul``'s scalar and leaves the rest to
    ``Tensor``'s override (which returns ``Counted`` results)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.mul and isinstance(args[1], (int, float)):
            args = (args[0], args[1] * 2)
        return super().__torch_function__(func, types, args, kwargs)


class Tagged(torch.Tensor):
    """No override of its own: ``Tensor.__torch_function__`` keeps results ``Tagged``."""


def _compile(fn: Any, backend: str) -> tuple[Any, list[torch.fx.GraphModule]]:
    graphs: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return kiln.backends.lookup_backend(backend)(gm, inputs)

    return kiln.compile(fn, fullgraph=True, backend=counting), graphs


def _plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def _function_program(x: torch.Tensor, y: torch.Tensor) -> Any:
    z = (x * 3 + y).sin()
    m = torch.max(z, 0)
    return z.sum(1) * 2, m.values, z.shape[0], isinstance(z, Counted)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_subclass_input(backend: str) -> None:
    compiled, graphs = _compile(_function_program, backend)
    for n in (4, 4, 4):
        base, y = torch.randn(n, 5), torch.randn(n, 5)
        x = base.as_subclass(Counted)
        expected = _function_program(x, y)
        got = compiled(base.as_subclass(Counted), y)
        assert [type(v) for v in got] == [type(v) for v in expected]
        assert type(got[0]) is Counted and got[3] is True
        torch.testing.assert_close(_plain(got[0]), _plain(expected[0]))
        torch.testing.assert_close(_plain(got[1]), _plain(expected[1]))
        assert got[2] == expected[2]
    assert len(graphs) == 1
    ops = [n for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    assert ops and all(not isinstance(n.meta["val"], Counted) for n in ops)


def _tagged_program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w).relu() + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_function_subclass_gradients(backend: str) -> None:
    """Training through ``Tensor``'s own override: the result is ``Tagged`` and the gradients
    of the subclass input and of a plain weight are eager's."""
    compiled, graphs = _compile(_tagged_program, backend)
    for _ in range(3):
        data, w0 = torch.randn(6, 4), torch.randn(4, 3)
        x, w = data.clone().as_subclass(Tagged).requires_grad_(), w0.clone().requires_grad_()
        ex, ew = data.clone().as_subclass(Tagged).requires_grad_(), w0.clone().requires_grad_()
        got, expected = compiled(x, w), _tagged_program(ex, ew)
        assert type(got) is type(expected) is Tagged
        torch.testing.assert_close(_plain(got), _plain(expected))
        got.sum().backward()
        expected.sum().backward()
        assert x.grad is not None and ex.grad is not None and w.grad is not None
        torch.testing.assert_close(_plain(x.grad), _plain(ex.grad))
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1


def test_plain_tensor_after_subclass_recompiles() -> None:
    """The input's exact type is guarded: a plain tensor gets its own graph (plain results)."""
    compiled, graphs = _compile(_tagged_program, "eager")
    x, w = torch.randn(6, 4), torch.randn(4, 3)
    assert type(compiled(x.as_subclass(Tagged), w)) is Tagged
    out = compiled(x, w)
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, _tagged_program(x, w))
    assert len(graphs) == 2


class Scaled(torch.Tensor):
    """A ``__torch_dispatch__`` wrapper: ``_data`` times ``_scale`` (both inner tensors).
    Multiplying by a number scales ``_scale`` alone (a ``Scaled`` result); every other op
    computes on the dequantized value and returns plain tensors, as float8's matmul does."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor) -> Scaled:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, data.shape, dtype=data.dtype, device=data.device
        )

    def __init__(self, data: torch.Tensor, scale: torch.Tensor) -> None:
        self._data = data
        self._scale = scale

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_scale"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, size: Any, stride: Any
    ) -> Scaled:
        return Scaled(inner["_data"], inner["_scale"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (
            func is torch.ops.aten.mul.Tensor
            and isinstance(args[0], Scaled)
            and not isinstance(args[1], torch.Tensor)
        ):
            return Scaled(args[0]._data, args[0]._scale * args[1])
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return Scaled(args[0]._data, args[0]._scale)

        def value(t: Any) -> Any:
            return t._data * t._scale if isinstance(t, Scaled) else t

        return func(*tree_map(value, args), **tree_map(value, kwargs))


def _scaled(n: int = 6) -> Scaled:
    return Scaled(torch.randn(n, 4), torch.rand(()) + 0.5)


def _dispatch_program(x: torch.Tensor, w: torch.Tensor) -> Any:
    y = x * 3  # still Scaled
    return (y @ w).relu().sum(0), y


@pytest.mark.parametrize("backend", BACKENDS)
def test_dispatch_wrapper_subclass_input(backend: str) -> None:
    """Outputs (a plain tensor and a rebuilt ``Scaled``) and the plain weight's gradient are
    eager's, over inputs with new data and scales."""
    compiled, graphs = _compile(_dispatch_program, backend)
    for _ in range(3):
        x, w0 = _scaled(), torch.randn(4, 3)
        w, ew = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        (got, got_y), (expected, expected_y) = compiled(x, w), _dispatch_program(x, ew)
        assert type(got) is torch.Tensor and type(got_y) is Scaled
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(got_y._data, expected_y._data)
        torch.testing.assert_close(got_y._scale, expected_y._scale)
        got.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1
    assert _programs() == (backend != "eager")  # one desugared program, in training too


def _programs() -> int:
    """Programs autograd_aot traced over wrapper inputs' inner tensors (the compiled path)."""
    return int(kiln.counters.snapshot().get("autograd_aot", {}).get("subclass_programs", 0))


def _scaled_matmul(x: torch.Tensor, w: torch.Tensor) -> Any:
    return ((x * 2) @ w,)


def _aot_compiled(x: torch.Tensor, w: torch.Tensor) -> tuple[Any, list[torch.fx.GraphModule]]:
    """``_scaled_matmul`` through autograd_aot alone, and the forward graphs it hands on."""
    from kiln.autograd_aot import aot_compile

    seen: list[torch.fx.GraphModule] = []

    def fw(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        seen.append(gm)
        return gm

    gm = torch.fx.symbolic_trace(_scaled_matmul)
    return aot_compile(gm, [x, w], fw_compiler=fw), seen


def test_dispatch_wrapper_is_desugared_at_the_aten_level() -> None:
    """autograd_aot's graph takes the inner tensors and holds plain ATen ops on them."""
    x, w = _scaled(), torch.randn(4, 3)
    compiled, seen = _aot_compiled(x, w)
    (out,) = compiled(x, w)
    torch.testing.assert_close(out, _scaled_matmul(x, w)[0])
    (graph,) = seen
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 3  # _data, _scale, w
    vals = [n.meta["val"] for n in graph.graph.nodes if "val" in n.meta]
    assert vals and not any(isinstance(v, Scaled) for v in vals)


def _dispatch_loss(x: torch.Tensor, w: torch.Tensor) -> Any:
    return ((x * 3) @ w).relu().sum(0), x.sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [_dispatch_loss, _dispatch_program])
def test_dispatch_wrapper_input_requiring_grad(backend: str, program: Any) -> None:
    """A wrapper input that requires grad: eager's gradients on the outer tensor and the
    weight. The backward is compiled (traced from eager's autograd over the wrappers), with a
    wrapper output that requires grad (``y``) too: it has eager's ``grad_fn``."""
    compiled, graphs = _compile(program, backend)
    for _ in range(2):
        data, scale, w0 = torch.randn(6, 4), torch.rand(()) + 0.5, torch.randn(4, 3)
        x = Scaled(data, scale).requires_grad_()
        ex = Scaled(data, scale).requires_grad_()
        w, ew = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        got, expected = compiled(x, w), program(ex, ew)
        assert [type(t) for t in got] == [type(t) for t in expected]
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]
        torch.testing.assert_close(_value(got[0]), _value(expected[0]))
        (got[0].sum() + _value(got[1]).sum()).backward()
        (expected[0].sum() + _value(expected[1]).sum()).backward()
        assert x.grad is not None and ex.grad is not None
        assert type(x.grad) is type(ex.grad)
        torch.testing.assert_close(_value(x.grad), _value(ex.grad))
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1
    assert _programs() == (backend != "eager")


def _wrapper_output_program(c: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
    return c.sin(), *_dispatch_program(x, w)  # an output eager does not differentiate first


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("use", ["outer", "wrapper_grad", "both"])
def test_dispatch_wrapper_output_requiring_grad(backend: str, use: str) -> None:
    """The wrapper output ``y`` requires grad over the wrapper input as in eager (a
    ``grad_fn`` on the outer tensor, none on its inner ones) and is compiled: its gradient,
    plain (``y`` used by an op outside) or a ``Scaled`` one, reaches ``x`` as eager's."""
    compiled, graphs = _compile(_wrapper_output_program, backend)
    for _ in range(2):
        c, data, scale = torch.randn(5), torch.randn(6, 4), torch.rand(()) + 0.5
        w0, v = torch.randn(2, 4, 3)
        y_grad, grads = Scaled(torch.randn(6, 4), torch.rand(()) + 0.5), []
        for f in (compiled, _wrapper_output_program):
            x, w = Scaled(data, scale).requires_grad_(), w0.clone().requires_grad_()
            sin, out, y = f(c, x, w)
            assert not sin.requires_grad and out.requires_grad
            assert type(y) is Scaled and y.grad_fn is not None and not y._data.requires_grad
            if use == "wrapper_grad":
                y.backward(y_grad)
            else:
                torch.autograd.backward([(y @ v).sum(), *([out.sum()] if use == "both" else [])])
            grads.append((x.grad, w.grad))
        (gx, gw), (ex, ew) = grads
        assert type(gx) is type(ex) is (Scaled if use == "wrapper_grad" else torch.Tensor)
        torch.testing.assert_close(_value(gx), _value(ex))
        assert (gw is None) == (ew is None) and (ew is None or torch.allclose(gw, ew))
    assert len(graphs) == 1
    assert _programs() == (backend != "eager")


def _value(t: torch.Tensor) -> torch.Tensor:
    """The plain value a (possibly nested) wrapper stands for."""
    if isinstance(t, Scaled):
        return _value(t._data) * _value(t._scale)
    return _value(t._elem) if isinstance(t, Recording) else t


def test_plain_tensor_after_wrapper_recompiles() -> None:
    compiled, graphs = _compile(_dispatch_program, "kiln")
    x, w = _scaled(), torch.randn(4, 3)
    compiled(x, w)
    plain = x._data * x._scale
    got = compiled(plain, w)
    torch.testing.assert_close(got[0], _dispatch_program(plain, w)[0])
    assert type(got[1]) is torch.Tensor
    assert len(graphs) == 2


CALLS: list[str] = []


class Logged(torch.Tensor):
    """An override with a side effect: it records every call torch hands it."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        CALLS.append(func.__name__)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_override_side_effects_match_eager() -> None:
    """The override's calls are eager's, once each per call: none from capture reading the
    input, none from the guards checking it."""

    def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * 2 + y).sin()

    compiled, graphs = _compile(program, "eager")
    for _ in range(3):
        x, y = torch.randn(4).as_subclass(Logged), torch.randn(4)
        CALLS.clear()
        program(x, y)
        expected = list(CALLS)
        CALLS.clear()
        compiled(x, y)
        assert CALLS == expected == ["mul", "add", "sin"]
    assert len(graphs) == 1


def test_type_of_a_dispatch_result_is_not_guessed() -> None:
    """The trace does not run the wrapper's dispatch, so it does not know a result's class: a
    branch on it is refused under fullgraph and breaks the graph otherwise, giving eager's
    answer (``x * 3`` is Scaled, ``x + 1`` plain)."""

    def program(x: torch.Tensor) -> Any:
        y, z = x * 3, x + 1
        return (y.sum() if isinstance(y, Scaled) else -y.sum()), isinstance(z, Scaled)

    x = _scaled()
    with pytest.raises(kiln.capture.errors.Unsupported):
        kiln.compile(program, fullgraph=True, backend="eager")(x)
    kiln.reset()
    got, expected = kiln.compile(program, backend="eager")(x), program(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] is expected[1] is False


def _mixed_outputs(x: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> Any:
    y = (x * 3) @ w
    with torch.no_grad():
        under_no_grad = y * 2
    return y.relu().sum(0), c.sin() * 2, y.detach() + 1, y.argmax(1), under_no_grad


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_dispatch_wrapper_training_outputs_require_grad_as_eager(backend: str) -> None:
    """Only the outputs eager differentiates require grad: one from an input that needs no
    gradient, a detached one, an integer one and one computed under ``no_grad`` do not (no
    ``grad_fn``), and the backward of the differentiable one gives eager's gradients."""
    compiled, graphs = _compile(_mixed_outputs, backend)
    for _ in range(3):
        data, scale, w0 = torch.randn(6, 4), torch.rand(()) + 0.5, torch.randn(4, 3)
        c = torch.randn(5)
        x, ex = Scaled(data, scale).requires_grad_(), Scaled(data, scale).requires_grad_()
        w, ew = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        got, expected = compiled(x, w, c), _mixed_outputs(ex, ew, c)
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]
        assert [t.grad_fn is None for t in got] == [t.grad_fn is None for t in expected]
        assert [t.requires_grad for t in got] == [True, False, False, False, False]
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)
        got[0].sum().backward()
        expected[0].sum().backward()
        assert x.grad is not None and ex.grad is not None
        torch.testing.assert_close(_value(x.grad), _value(ex.grad))
        torch.testing.assert_close(w.grad, ew.grad)
        with pytest.raises(RuntimeError, match="does not require grad"):
            got[2].sum().backward()
    assert len(graphs) == 1
    assert _programs() == (backend != "eager")


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_dispatch_wrapper_input_changed_in_place_before_backward(backend: str) -> None:
    """A weight the backward needs, written in place after the forward, makes backward raise
    as eager's does; one it does not need (only summed) does not."""

    def program(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ((x * 3) @ w).relu().sum(0) + b.sum()

    compiled, _ = _compile(program, backend)
    for f in (program, compiled):
        x = Scaled(torch.randn(6, 4), torch.rand(()) + 0.5).requires_grad_()
        w, b = torch.randn(4, 3).requires_grad_(), torch.randn(3).requires_grad_()
        out = f(x, w, b)
        with torch.no_grad():
            b.mul_(2)
        out.sum().backward(retain_graph=True)
        with torch.no_grad():
            w.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


# wrapper subclasses nested in wrapper subclasses ---------------------------------------

RECORDED: list[str] = []


class Recording(torch.Tensor):
    """A ``__torch_dispatch__`` wrapper around one tensor (a logging tensor): it records every
    ATen op it is handed, runs it on ``_elem`` (itself possibly a wrapper) and wraps the
    tensor results again."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Recording:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device
        )

    def __init__(self, elem: torch.Tensor) -> None:
        self._elem = elem

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_elem"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, size: Any, stride: Any
    ) -> Recording:
        return Recording(inner["_elem"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        RECORDED.append(func.__name__)
        args, kwargs = tree_map_only(Recording, lambda t: t._elem, (args, kwargs or {}))
        return tree_map_only(torch.Tensor, Recording, func(*args, **kwargs))


def _nested(kind: str, n: int = 6) -> torch.Tensor:
    """A fresh random input of the given nesting (outer class first)."""
    data, scale, inner_scale = torch.randn(n, 4), torch.rand(()) + 0.5, torch.rand(()) + 0.5
    if kind == "scaled":
        return Scaled(data, scale)
    if kind == "scaled(recording)":
        return Scaled(Recording(data), scale)
    if kind == "scaled(scaled)":
        return Scaled(Scaled(data, inner_scale), scale)
    assert kind == "recording(scaled)"
    return Recording(Scaled(data, scale))


NESTINGS = ["scaled(recording)", "scaled(scaled)", "recording(scaled)"]


def _structure(t: Any) -> Any:
    """The classes of a wrapper's levels, down to its plain tensors."""
    if isinstance(t, (Scaled, Recording)):
        names, _ = t.__tensor_flatten__()
        return (type(t), *(_structure(getattr(t, n)) for n in names))
    return type(t)


def _same_leaf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``b`` rebuilt with ``a``'s plain tensors (a copy of the same nesting, same values)."""
    if isinstance(a, (Scaled, Recording)):
        names, ctx = a.__tensor_flatten__()
        inner = {n: _same_leaf(getattr(a, n), getattr(b, n)) for n in names}
        return type(a).__tensor_unflatten__(inner, ctx, a.shape, a.stride())  # type: ignore[attr-defined,no-any-return]
    return a.clone()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", NESTINGS)
def test_nested_dispatch_wrapper_input(backend: str, kind: str) -> None:
    """Both levels' ``__torch_dispatch__`` run while tracing and the compiled program holds
    their ATen ops on the innermost tensors: outputs (a nested ``y`` rebuilt level by level)
    and the plain weight's gradient are eager's over fresh inputs, from one program."""
    compiled, graphs = _compile(_dispatch_program, backend)
    for _ in range(3):
        x, w0 = _nested(kind), torch.randn(4, 3)
        w, ew = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        (got, got_y), (expected, expected_y) = compiled(x, w), _dispatch_program(x, ew)
        assert _structure(got) == _structure(expected)
        assert _structure(got_y) == _structure(expected_y) == _structure(x)
        torch.testing.assert_close(_value(got), _value(expected))
        torch.testing.assert_close(_value(got_y), _value(expected_y))
        got.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1
    assert _programs() == (backend != "eager")


@pytest.mark.parametrize("kind", NESTINGS)
def test_nested_dispatch_wrapper_is_desugared_to_innermost_tensors(kind: str) -> None:
    """autograd_aot's graph takes the innermost plain tensors and records no wrapper; running
    it does not call either level's ``__torch_dispatch__``."""
    x, w = _nested(kind), torch.randn(4, 3)
    compiled, seen = _aot_compiled(x, w)
    compiled(x, w)  # traced on its first call: both levels' dispatch run on fakes
    for _ in range(2):
        x = _nested(kind)
        RECORDED.clear()
        (out,) = compiled(x, w)
        assert RECORDED == []  # no level's dispatch ran: the compiled ATen did the work
        torch.testing.assert_close(_value(out), _value(_scaled_matmul(x, w)[0]))
    (graph,) = seen
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == {"scaled(scaled)": 4}.get(kind, 3)
    vals = [n.meta["val"] for n in graph.graph.nodes if "val" in n.meta]
    assert vals and not any(isinstance(v, (Scaled, Recording)) for v in vals)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("kind", NESTINGS)
@pytest.mark.parametrize("program", [_dispatch_loss, _dispatch_program])
def test_nested_dispatch_wrapper_input_requiring_grad(
    backend: str, kind: str, program: Any
) -> None:
    """A nested wrapper input that requires grad gets eager's gradient (its type and value),
    the plain weight too; with ``_dispatch_program`` the nested output ``y`` requires grad as
    in eager and takes part in the loss."""
    compiled, graphs = _compile(program, backend)
    for _ in range(3):
        x0, w0 = _nested(kind), torch.randn(4, 3)
        x, ex = x0.requires_grad_(), _same_leaf(x0, x0).requires_grad_()
        w, ew = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        got, expected = compiled(x, w), program(ex, ew)
        assert [_structure(t) for t in got] == [_structure(t) for t in expected]
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(_value(g), _value(e))
        (got[0].sum() + got[1].sum()).backward()
        (expected[0].sum() + expected[1].sum()).backward()
        assert x.grad is not None and ex.grad is not None
        assert _structure(x.grad) == _structure(ex.grad)
        torch.testing.assert_close(_value(x.grad), _value(ex.grad))
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1
    assert _programs() == 1


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("kind", NESTINGS)
@pytest.mark.parametrize("use", ["outer", "wrapper_grad"])
def test_nested_dispatch_wrapper_output_requiring_grad(backend: str, kind: str, use: str) -> None:
    """The nested output ``y`` has eager's ``grad_fn`` on its outer tensor; its gradient, a
    plain tensor or a wrapper of ``y``'s nesting, reaches the nested input as eager's."""
    compiled, graphs = _compile(_wrapper_output_program, backend)
    for _ in range(2):
        c, x0, w0, v = torch.randn(5), _nested(kind), torch.randn(4, 3), torch.randn(4, 3)
        grads = []
        for f in (compiled, _wrapper_output_program):
            x, w = _same_leaf(x0, x0).requires_grad_(), w0.clone().requires_grad_()
            sin, out, y = f(c, x, w)
            assert not sin.requires_grad and out.requires_grad
            assert _structure(y) == _structure(x) and y.grad_fn is not None
            if use == "wrapper_grad":
                y.backward(_same_leaf(x0, x0))
            else:
                (y @ v).sum().backward()
            grads.append((x.grad, w.grad))
        (gx, gw), (ex, ew) = grads
        assert gx is not None and ex is not None and _structure(gx) == _structure(ex)
        torch.testing.assert_close(_value(gx), _value(ex))
        assert gw is None and ew is None
    assert len(graphs) == 1
    assert _programs() == 1


def test_nesting_changing_between_calls_traces_again() -> None:
    """One captured graph serves inputs whose nesting changes: each new nesting traces its own
    program (training included), an earlier one is reused, every result is eager's."""
    compiled, graphs = _compile(_dispatch_loss, "kiln")
    kinds = ["scaled", "scaled(scaled)", "scaled(recording)", "scaled", "scaled(scaled)"]
    for kind in kinds:
        x0, w0 = _nested(kind), torch.randn(4, 3)
        x, ex = x0.requires_grad_(), _same_leaf(x0, x0).requires_grad_()
        w, ew = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        got, expected = compiled(x, w), _dispatch_loss(ex, ew)
        for g, e in zip(got, expected, strict=True):
            assert _structure(g) == _structure(e)
            torch.testing.assert_close(_value(g), _value(e))
        (got[0].sum() + got[1]).backward()
        (expected[0].sum() + expected[1]).backward()
        assert x.grad is not None and ex.grad is not None
        torch.testing.assert_close(_value(x.grad), _value(ex.grad))
        torch.testing.assert_close(w.grad, ew.grad)
    assert len(graphs) == 1
    assert _programs() == 3
