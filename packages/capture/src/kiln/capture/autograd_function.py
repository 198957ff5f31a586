"""Custom ``torch.autograd.Function``s: ``Fn.apply(*args)`` as one graph node, checked first.

A custom Function's point is a backward that differs from the derivative of its forward (a
straight-through estimator, a clipped gradient), so its forward cannot simply be inlined: the
graph would differentiate the forward's ops instead. The call becomes one node whose target
calls ``Fn.apply`` (:func:`apply_target`). Run on real tensors (the ``eager`` backend) that is
the user's Function; run under autograd_aot's dispatch-level tracer, autograd itself records
the forward's ATen ops and, when the joint graph is traced, calls the user's ``backward`` on
the tracer's tensors, so both halves become ATen graphs that the backend compiles.

Recording a call of user code is sound only if that code is what capture would trace anyway:
before the node is made, :func:`call_apply` traces ``forward`` (or ``forward`` then
``setup_context``) and ``backward`` with capture's own tracer on the same arguments, with
:class:`TracedCtx` standing in for autograd's ctx, then rolls the trace back. What they read
from globals, closures and objects is guarded as in any inlined call; a side effect, a tensor
reached other than through ``apply``'s arguments (it would be baked into the compiled graph),
or anything capture cannot trace is an ``autograd_function`` graph break naming the method,
and the call runs in Python.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import contexts, dispatch, torch_calls
from kiln.capture.breaks.reasons import UserException, unsupported
from kiln.capture.errors import Unsupported
from kiln.capture.torch_functions import is_apply
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.values.containers import DictValue, ListValue, TupleValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.wrap import wrap

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["TraceState", "TracedCtx", "apply_target", "call_apply", "is_apply"]

_BASE_SETUP_CONTEXT = torch.autograd.Function.setup_context


class TracedCtx:
    """What capture's tracer sees as ``ctx`` while it checks a Function's methods.

    Plain Python, so capture inlines its methods like user code; it mirrors the parts of
    autograd's ctx that forward and backward use.
    """

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[Any, ...] = ()
        self.dirty: tuple[Any, ...] = ()
        self.non_differentiable: tuple[Any, ...] = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        self.dirty = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    @property
    def saved_variables(self) -> tuple[Any, ...]:
        return self.saved_tensors


_TARGETS: weakref.WeakKeyDictionary[type, Callable[..., Any]] = weakref.WeakKeyDictionary()


def apply_target(cls: type) -> Callable[..., Any]:
    """The graph node target for ``cls.apply``: a plain function (fx cannot name a method
    bound to a class), one per class, marked with ``autograd_function`` for graph readers."""
    found = _TARGETS.get(cls)
    if found is None:

        def apply(*args: Any) -> Any:
            return cls.apply(*args)  # type: ignore[attr-defined]

        apply.__name__ = f"{cls.__name__}_apply"
        apply.__qualname__ = f"{cls.__qualname__}.apply"
        apply.autograd_function = cls  # type: ignore[attr-defined]
        found = _TARGETS[cls] = apply
    return found


def call_apply(tr: Tracer, fv: ObjectValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``Fn.apply(*args)``: checked by tracing its methods, then recorded as one node."""
    cls = fv.obj.__self__
    if kwargs:
        raise unsupported("autograd_function", f"{cls.__qualname__}.apply with keyword arguments")
    src = fv.source.attr("__self__") if fv.source is not None else None
    _check_methods(tr, wrap(tr.out, cls, src), cls, args)
    return torch_calls.call_function(tr, apply_target(cls), args, {})


def _check_methods(tr: Tracer, cls_value: Value, cls: type, args: list[Value]) -> None:
    """Trace forward and backward on ``args`` and undo the trace, keeping its guards.

    With ``set_materialize_grads(False)`` autograd hands backward None for an output no
    gradient reached, so backward is traced once more for each such pattern."""
    cp = tr.checkpoint()
    before = TraceState(tr)
    grad_mode = torch.is_grad_enabled()
    try:
        tensors, materialize = _trace(tr, cls_value, cls, args, before, frozenset())
        for absent in [] if materialize else _absent_patterns(tensors):
            tr.rollback(cp)
            _trace(tr, cls_value, cls, args, before, absent)
    finally:
        torch._C._set_grad_enabled(grad_mode)
    tr.rollback(cp)


class TraceState:
    """What a check must leave as it found: graph inputs, recorded effects, the frame's
    containers (a mutation changes these without recording an effect, as the end of the frame
    writes them back; one first read inside the check joins the end of the list)."""

    def __init__(self, tr: Tracer) -> None:
        self.inputs = sum(1 for n in tr.out.graph.nodes if n.op == "placeholder")
        self.effects = tr.out.side_effects.version
        self.containers = _container_contents(tr)

    def check(self, tr: Tracer, method: str, *, kind: str = "autograd_function") -> None:
        """Raise a ``kind`` break if ``method`` changed what outlives it or, for a Function
        (whose tensors must be apply's arguments), made a graph input."""
        now = TraceState(tr)
        old = len(self.containers)
        changed = now.containers[:old] != self.containers or any(
            mutated for _, _, mutated in now.containers[old:]
        )
        if changed or now.effects != self.effects:
            raise unsupported(kind, f"{method} changes state that outlives the call")
        if kind == "autograd_function" and now.inputs != self.inputs:
            detail = (
                f"{method} reads a tensor that is not an argument of apply (pass it to apply, "
                "so that it is an input of the compiled graph)"
            )
            raise unsupported("autograd_function", detail)


def _trace(
    tr: Tracer,
    cls_value: Value,
    cls: type,
    args: list[Value],
    before: TraceState,
    absent: frozenset[int],
) -> tuple[list[int], bool]:
    """One trace of forward, then backward with None for the outputs in ``absent``: which
    outputs are tensors, and whether ctx materializes missing gradients."""
    # apply runs forward with grad disabled; autograd's engine runs backward so too (no
    # create_graph), which once_differentiable's wrapper checks
    contexts.set_grad_mode(tr, False)
    needs = tuple(isinstance(a, TensorValue) and a.fake.requires_grad for a in args)
    method = f"{cls.__qualname__}.forward"
    try:
        ctx = dispatch.call(tr, ObjectValue(TracedCtx), [ConstantValue(needs)], {})
        out = _forward(tr, cls_value, cls, ctx, args)
        before.check(tr, method)
        method = f"{cls.__qualname__}.backward"
        items = _items(out)
        grads = [
            ConstantValue(None) if i in absent else _grad_like(tr, o) for i, o in enumerate(items)
        ]
        dispatch.call(tr, dispatch.get_attr(tr, cls_value, "backward"), [ctx, *grads], {})
        before.check(tr, method)
        materialize = dispatch.get_attr(tr, ctx, "materialize_grads")
    except Unsupported as e:
        if e.kind == "autograd_function":
            raise
        if absent and isinstance(e, UserException):
            # backward raising for a pattern the program may never produce (a backward that
            # assumes its first gradient is there): where it does, eager raises too
            before.check(tr, method)
            return [], True
        raise unsupported("autograd_function", f"{method}: {e.kind}: {e.explanation}") from e
    tensors = [i for i, o in enumerate(items) if isinstance(o, TensorValue)]
    return tensors, not (isinstance(materialize, ConstantValue) and materialize.value is False)


def _absent_patterns(tensors: list[int]) -> list[frozenset[int]]:
    """Which outputs' gradients may be None together: every proper subset for a few outputs
    (with none, backward is not called), one at a time beyond."""
    if len(tensors) > 4:
        return [frozenset({i}) for i in tensors]
    found = []
    for mask in range(1, 2 ** len(tensors) - 1):
        found.append(frozenset(i for bit, i in enumerate(tensors) if mask >> bit & 1))
    return found


def _forward(tr: Tracer, cls_value: Value, cls: type, ctx: Value, args: list[Value]) -> Value:
    forward = dispatch.get_attr(tr, cls_value, "forward")
    tr.out.guard_class_attr(cls, "setup_context")
    if getattr(cls, "setup_context", _BASE_SETUP_CONTEXT) == _BASE_SETUP_CONTEXT:
        return dispatch.call(tr, forward, [ctx, *args], {})
    out = dispatch.call(tr, forward, args, {})
    setup = dispatch.get_attr(tr, cls_value, "setup_context")
    dispatch.call(tr, setup, [ctx, TupleValue(list(args)), out], {})
    return out


def _items(out: Value) -> list[Value]:
    if isinstance(out, (TupleValue, ListValue)):
        return list(out.items)
    return [out]


def _grad_like(tr: Tracer, out: Value) -> Value:
    """A stand-in gradient for one output: a tensor like it, None for a non-tensor."""
    if not isinstance(out, TensorValue):
        return ConstantValue(None)
    return torch_calls.call_function(tr, torch.ones_like, [out], {})


def _container_contents(tr: Tracer) -> list[tuple[ListValue | DictValue, Any, bool]]:
    return [
        (c, list(c.items) if isinstance(c, ListValue) else dict(c.items), c.mutated)
        for c in tr.out.side_effects.containers
    ]
