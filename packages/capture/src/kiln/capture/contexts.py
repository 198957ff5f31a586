"""Grad-mode and autocast context managers inside a captured function.

``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``
and ``torch.inference_mode()`` change the grad mode both while tracing (so
fake results get the right ``requires_grad``) and in the graph, as
``torch._C._set_grad_enabled`` nodes, so the compiled graph switches modes
where eager code would. (Inside ``inference_mode`` the graph disables grad;
its results are ordinary tensors, not inference tensors.) ``torch.autocast``
is entered while tracing and recorded as ``_enter_autocast``/``_exit_autocast``
nodes around the ops it covers. Activation checkpointing's region
(``checkpointing.recompute_region``) marks the nodes made inside it.
"""

from __future__ import annotations

import itertools
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture import checkpointing, dispatch, literals
from kiln.capture.breaks.reasons import unsupported
from kiln.capture.values.base import ConstantValue, Value
from kiln.capture.wrap import function_value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = [
    "AutocastValue",
    "ContextValue",
    "DecoratedValue",
    "ExitValue",
    "RegionValue",
    "decorate",
    "make_context",
]


class ContextValue(Value):
    """A grad-mode context manager: ``target`` is the mode inside the block."""

    def __init__(self, target: bool, applied_at_creation: bool = False) -> None:
        self.target = target
        self.applied_at_creation = applied_at_creation
        self.previous: list[bool] = []

    def python_type(self) -> type:
        return torch.no_grad if not self.target else torch.enable_grad

    def enter(self, tr: Tracer) -> None:
        if self.applied_at_creation:
            return
        self.previous.append(torch.is_grad_enabled())
        set_grad_mode(tr, self.target)

    def exit(self, tr: Tracer) -> None:
        if not self.previous:
            return
        set_grad_mode(tr, self.previous.pop())


class AutocastValue(ContextValue):
    """``torch.autocast(...)``: the real object is entered while tracing, nodes mark the block."""

    def __init__(self, real: torch.autocast) -> None:
        super().__init__(torch.is_grad_enabled())
        self.real = real
        self.nodes: list[Any] = []

    def python_type(self) -> type:
        return type(self.real)

    def enter(self, tr: Tracer) -> None:
        r = self.real
        vals = (r.device, r.fast_dtype, r._enabled, r._cache_enabled)
        self.real.__enter__()
        tr.out.entered.append(self.real)
        enter = torch.amp.autocast_mode._enter_autocast
        self.nodes.append(tr.out.create_node("call_function", enter, vals, {}, None))

    def exit(self, tr: Tracer) -> None:
        if not self.nodes:
            return
        self.real.__exit__(None, None, None)
        tr.out.entered.remove(self.real)
        exit_fn = torch.amp.autocast_mode._exit_autocast
        tr.out.create_node("call_function", exit_fn, (self.nodes.pop(),), {}, None)


_REGION_IDS = itertools.count()


class RegionValue(ContextValue):
    """A checkpointed region: the ops traced inside get ``meta["kiln_recompute"]``, one id
    per region (a nested region's ops take the enclosing one's: the whole is recomputed)."""

    def __init__(self) -> None:
        super().__init__(torch.is_grad_enabled())
        self.before: list[set[Any]] = []

    def python_type(self) -> type:
        return checkpointing.recompute_region

    def enter(self, tr: Tracer) -> None:
        self.before.append(set(tr.out.graph.nodes))

    def exit(self, tr: Tracer) -> None:
        if not self.before:
            return
        before, region = self.before.pop(), next(_REGION_IDS)
        for node in tr.out.graph.nodes:
            if node not in before and node.op.startswith("call_"):
                node.meta["kiln_recompute"] = region


class ExitValue(Value):
    """The ``__exit__`` BEFORE_WITH leaves on the stack for a grad-mode context."""

    def __init__(self, ctx: ContextValue) -> None:
        self.ctx = ctx

    def python_type(self) -> type:
        return types.MethodType


class DecoratedValue(Value):
    """A function wrapped by a grad-mode context used as a decorator."""

    def __init__(self, ctx: ContextValue, fn: Value) -> None:
        self.ctx = ctx
        self.fn = fn

    def python_type(self) -> type:
        return type(lambda: None)


def set_grad_mode(tr: Tracer, enabled: bool) -> None:
    """Switch grad mode now (for fake evaluation) and at this point of the graph."""
    if torch.is_grad_enabled() == enabled:
        return
    torch._C._set_grad_enabled(enabled)
    tr.out.create_node("call_function", torch._C._set_grad_enabled, (enabled,), {}, None)


def make_context(obj: Any, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """The context value for calling ``obj`` (a grad-mode class), else None."""
    if obj is torch.no_grad:
        return ContextValue(False)
    if obj is torch.enable_grad:
        return ContextValue(True)
    if obj is torch.set_grad_enabled:
        mode = (args[0] if args else kwargs["mode"]).as_constant()
        return _applied(bool(mode))
    if obj is checkpointing.recompute_region:
        return RegionValue()
    if obj is torch.inference_mode:
        mode = (args[0] if args else kwargs.get("mode", ConstantValue(True))).as_constant()
        # c10's InferenceMode(enabled) sets grad mode to ``not enabled``: inference_mode(False)
        # enables grad, even inside no_grad.
        return ContextValue(not mode)
    if isinstance(obj, type) and issubclass(obj, torch.amp.autocast):
        plain = [literals.literal(a) for a in args]
        plain_kw = {k: literals.literal(v) for k, v in kwargs.items()}
        try:
            return AutocastValue(obj(*plain, **plain_kw))
        except Exception as e:
            raise unsupported("unsupported_context", f"autocast: {e}") from e
    return None


def _applied(mode: bool) -> ContextValue:
    ctx = ContextValue(mode, applied_at_creation=True)
    ctx.previous.append(torch.is_grad_enabled())
    return ctx


def apply_now(tr: Tracer, ctx: ContextValue) -> None:
    """``torch.set_grad_enabled(b)`` takes effect when called, not only in a ``with``."""
    set_grad_mode(tr, ctx.target)


def decorate(tr: Tracer, ctx: ContextValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if len(args) != 1 or kwargs:
        raise unsupported("unsupported_call", "a grad-mode context called with arguments")
    return DecoratedValue(ctx, args[0])


@dispatch.CALL.register(DecoratedValue)
def _call_decorated(
    tr: Tracer, fn: DecoratedValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    fn.ctx.enter(tr)
    result = dispatch.call(tr, fn.fn, args, kwargs)
    fn.ctx.exit(tr)
    return result


@dispatch.CALL.register(checkpointing.CheckpointValue)
def _call_checkpoint(
    tr: Tracer, fn: checkpointing.CheckpointValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    why = checkpointing.untraceable(fn.obj, args, kwargs)
    if why is not None:
        raise unsupported("unsupported_call", why)
    stand_in = checkpointing.stand_in(fn.obj)
    assert stand_in is not None
    return dispatch.call(tr, function_value(stand_in, None), args, kwargs)


@dispatch.CALL.register(ExitValue)
def _call_exit(tr: Tracer, fn: ExitValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn.ctx.exit(tr)
    return ConstantValue(None)


@dispatch.CALL.register(ContextValue)
def _call_context(
    tr: Tracer, fn: ContextValue, args: list[Value], kwargs: dict[str, Value]
) -> Value:
    return decorate(tr, fn, args, kwargs)
