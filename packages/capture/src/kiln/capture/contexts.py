"""Grad-mode context managers inside a captured function.

``torch.no_grad()``, ``torch.enable_grad()`` and ``torch.set_grad_enabled(b)``
change the grad mode both while tracing (so fake results get the right
``requires_grad``) and in the graph, as ``torch._C._set_grad_enabled``
nodes, so the compiled graph switches modes where eager code would.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.break_reasons import unsupported
from kiln.capture.values.base import Value

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

__all__ = ["ContextValue", "ExitValue", "DecoratedValue", "decorate", "make_context"]


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
    if obj in (torch.inference_mode, torch.autocast, torch.amp.autocast):
        raise unsupported("unsupported_context", getattr(obj, "__name__", repr(obj)))
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
