"""The backend registry: names for ``(fx.GraphModule, example_inputs) -> callable`` functions.

This follows PyTorch's own compiler's backend convention, so a backend written for one works with the other.
Built-ins: ``eager`` (the captured graph as is), ``aot_eager`` and ``aot_eager_decomp_partition``
(ATen graphs run eagerly, for debugging autograd_aot), ``kiln`` (the default:
:func:`kiln.loopir.compile_fx`, which owns loopir's rewrites, autograd_aot and the code generator
registered for each device) and ``loopir_reference`` (the same with loopir's reference backend).

As in PyTorch's compiler, options and modes reach a backend as a keyword: ``kiln.compile``
calls ``backend(gm, example_inputs, options={...})`` when the user's mode or options hold
backend settings (``config.BACKEND_OPTIONS``), and refuses up front a backend that has no
``options`` parameter, so a setting is never silently ignored.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from torch import fx

from kiln import autograd_aot, loopir

__all__ = ["Backend", "register_backend", "list_backends", "lookup_backend", "takes_options"]

Backend: TypeAlias = Callable[..., Callable[..., Any]]
"""``(gm, example_inputs) -> callable``, with an optional ``options=`` keyword."""

_registry: dict[str, Backend] = {}


def register_backend(name: str | Backend | None = None, *, override: bool = False) -> Any:
    """Register a backend under ``name``; usable as ``@register_backend`` or ``@register_backend("x")``.

    Re-registering a name raises unless ``override=True``, so two libraries never silently
    replace each other's backend.
    """

    def decorate(fn: Backend, key: str | None = None) -> Backend:
        key = key or getattr(fn, "__name__", None)
        if not isinstance(key, str) or not key:
            msg = "register_backend: give the backend a name"
            raise ValueError(msg)
        if not callable(fn):
            msg = f"register_backend: backend {key!r} must be callable, got {type(fn).__name__}"
            raise TypeError(msg)
        if key in _registry and not override:
            msg = f"register_backend: a backend named {key!r} exists; pass override=True to replace it"
            raise ValueError(msg)
        _registry[key] = fn
        return fn

    if callable(name):
        return decorate(name)
    return lambda fn: decorate(fn, name)


def list_backends() -> list[str]:
    """The names of every registered backend, sorted."""
    return sorted(_registry)


def lookup_backend(backend: str | Backend) -> Backend:
    """A backend by name (ValueError listing the valid names) or a callable backend as is."""
    if isinstance(backend, str):
        if backend not in _registry:
            msg = f"unknown backend {backend!r}; valid backends: {', '.join(list_backends())}"
            raise ValueError(msg)
        return _registry[backend]
    if not callable(backend):
        msg = f"backend must be a name or a callable, got {type(backend).__name__}"
        raise TypeError(msg)
    return backend


def takes_options(backend: Backend) -> bool:
    """Whether ``backend`` accepts the ``options=`` keyword."""
    try:
        params = inspect.signature(backend).parameters
    except (TypeError, ValueError):
        return False
    return "options" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@register_backend
def eager(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """Run the captured graph as is: checks capture alone."""
    return gm.forward


# the captured graph computes its sizes from its inputs, so it runs at any size
eager.dynamic_shapes = True  # type: ignore[attr-defined]


@register_backend
def aot_eager(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """ATen-level graphs from autograd_aot, run with eager kernels."""
    return autograd_aot.aot_eager(gm, example_inputs)


# autograd_aot traces a graph with symbolic sizes and numbers once, for every value it admits
aot_eager.dynamic_shapes = True  # type: ignore[attr-defined]


@register_backend
def aot_eager_decomp_partition(
    gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> Callable[..., Any]:
    """aot_eager with decompositions and the min-cut partitioner applied."""
    return autograd_aot.aot_eager_decomp_partition(gm, example_inputs)


aot_eager_decomp_partition.dynamic_shapes = True  # type: ignore[attr-defined]


@register_backend
def kiln(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The default: autograd_aot to ATen, loopir to kernels, a code generator per device."""
    return loopir.compile_fx(gm, example_inputs, options=options)


# loopir compiles a graph with symbolic sizes and numbers once (a number is a kernel argument);
# where it meets a construct it compiles for static sizes only it raises
# loopir.StaticShapesOnly, and the frontend compiles per size
kiln.dynamic_shapes = True  # type: ignore[attr-defined]


@register_backend
def loopir_reference(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """The default pipeline with loopir's reference backend: kernels evaluated by torch ops."""
    return loopir.compile_fx(gm, example_inputs, backend=loopir.ReferenceBackend(), options=options)
